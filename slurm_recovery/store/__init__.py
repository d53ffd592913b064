"""The controller's persistent state: an SQLite store of evidence, incidents, advice,
milestones, actions, node state and a hash-chained, append-only audit log (docs/store.md)."""

from .attempts import AttemptRelation, JobAttempt, relate
from .audit import (
    GENESIS_HASH,
    AuditAnchor,
    AuditProblem,
    AuditRow,
    AuditVerification,
    verify_chain,
)
from .errors import (
    ConflictError,
    NotAStoreError,
    SchemaVersionError,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreOpenError,
    StoreReadOnlyError,
    UnknownRecordError,
)
from .records import (
    ACTION_RESULTS,
    MILESTONES,
    Action,
    Advice,
    AttemptRecord,
    Evidence,
    EvidenceRecord,
    Incident,
    NodeState,
)
from .schema import LATEST_VERSION, MIGRATIONS, Migration, migrate
from .store import DEFAULT_PATH, Store

__all__ = [
    "ACTION_RESULTS",
    "DEFAULT_PATH",
    "GENESIS_HASH",
    "LATEST_VERSION",
    "MIGRATIONS",
    "MILESTONES",
    "Action",
    "Advice",
    "AttemptRecord",
    "AttemptRelation",
    "AuditAnchor",
    "AuditProblem",
    "AuditRow",
    "AuditVerification",
    "ConflictError",
    "Evidence",
    "EvidenceRecord",
    "Incident",
    "JobAttempt",
    "Migration",
    "NodeState",
    "NotAStoreError",
    "SchemaVersionError",
    "Store",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreError",
    "StoreFullError",
    "StoreOpenError",
    "StoreReadOnlyError",
    "UnknownRecordError",
    "migrate",
    "relate",
    "verify_chain",
]
