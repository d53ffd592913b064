"""The controller refuses a store other users could write, and warns when they can read it."""

from __future__ import annotations

import pytest

from slurm_recovery.controller import UnsafeStateError, check_state_permissions


def test_a_private_store_passes_quietly(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o750)
    folder.chmod(0o750)
    db = folder / "state.db"
    db.write_bytes(b"")
    db.chmod(0o640)
    assert check_state_permissions(db) == []
    assert check_state_permissions(tmp_path / "absent" / "state.db") == []  # created later


def test_a_world_writable_directory_is_refused_unless_sticky(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(UnsafeStateError, match=f"chmod 0750 {folder}"):
        check_state_permissions(folder / "state.db")
    folder.chmod(0o1777)  # like /tmp: others cannot replace our files
    assert check_state_permissions(folder / "state.db") == []


@pytest.mark.parametrize("name", ["state.db", "state.db-wal"])
def test_a_world_writable_store_file_is_refused(tmp_path, name):
    (tmp_path / "state.db").write_bytes(b"")
    (tmp_path / name).write_bytes(b"")
    (tmp_path / name).chmod(0o666)
    with pytest.raises(UnsafeStateError, match=r"world-writable .* forge evidence"):
        check_state_permissions(tmp_path / "state.db")


def test_a_store_every_user_can_read_is_a_warning(tmp_path):
    tmp_path.chmod(0o755)
    db = tmp_path / "state.db"
    db.write_bytes(b"")
    db.chmod(0o644)
    [warning] = check_state_permissions(db)
    assert "readable by every user" in warning and f"chmod 0640 {db}" in warning
    tmp_path.chmod(0o750)  # others cannot enter the directory: no warning
    assert check_state_permissions(db) == []
