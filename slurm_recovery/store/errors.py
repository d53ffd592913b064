"""Errors the store raises: every SQLite failure leaves it as a :class:`StoreError` subclass.

Bad arguments are not store errors: they raise ``ValueError``/``TypeError`` naming the field.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


class StoreError(Exception):
    """The store could not do what was asked; nothing was half-written."""


class StoreOpenError(StoreError):
    """The database cannot be opened or is not one this version can use."""


class NotAStoreError(StoreOpenError):
    """The file is not a slurm-recovery database (not SQLite, or another program's)."""


class SchemaVersionError(StoreOpenError):
    """The database's schema is newer than this version knows, or (read-only) older."""


class StoreReadOnlyError(StoreError):
    """A write was refused: the store or its file or directory is read-only."""


class StoreFullError(StoreError):
    """The disk (or the database's size limit) is full; the write was rolled back."""


class StoreBusyError(StoreError):
    """Another connection held the write lock for longer than the busy timeout."""


class StoreCorruptError(StoreError):
    """SQLite reports the database file as damaged; restore from a backup."""


class UnknownRecordError(StoreError, LookupError):
    """A write referred to a record (incident, advice, attempt, evidence) that does not exist."""


class ConflictError(StoreError):
    """The write contradicts what is stored (e.g. an incident is already open for the attempt)."""


def wrap_sqlite_error(exc: sqlite3.Error, path: str | Path) -> StoreError:
    """Translate a ``sqlite3`` exception into the matching :class:`StoreError` subclass."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    where = f"store {path}"
    if name == "SQLITE_FULL":
        return StoreFullError(f"{where}: disk or database size limit full ({exc}); write undone")
    if name.startswith("SQLITE_READONLY"):
        return StoreReadOnlyError(f"{where}: read-only ({exc})")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreBusyError(f"{where}: locked by another writer ({exc})")
    if name == "SQLITE_NOTADB":
        return NotAStoreError(f"{where}: not an SQLite database ({exc})")
    if name.startswith("SQLITE_CORRUPT"):
        return StoreCorruptError(f"{where}: database is damaged ({exc}); restore a backup")
    if name.startswith("SQLITE_CANTOPEN"):
        return StoreOpenError(
            f"{where}: cannot open ({exc}); check that the directory exists and is writable"
        )
    return StoreError(f"{where}: {exc}")
