"""Audit-log checks an admin can run on any host with the database file (read-only):

    python -m slurm_recovery.store head   [--db PATH]
    python -m slurm_recovery.store verify [--db PATH] [--anchor SEQ:HASH]

``verify`` exits 0 when the chain is intact, 1 when it is not (naming the first bad row),
2 when the store cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .audit import AuditAnchor
from .errors import StoreError
from .store import DEFAULT_PATH, Store


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_recovery.store", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    head = commands.add_parser("head", help="print the last audit row as SEQ:HASH (an anchor)")
    verify = commands.add_parser("verify", help="walk the audit chain")
    for sub in (head, verify):
        sub.add_argument("--db", default=str(DEFAULT_PATH), help=f"default {DEFAULT_PATH}")
    verify.add_argument(
        "--anchor",
        type=AuditAnchor.parse,
        help="SEQ:HASH printed earlier by 'head': also detects rows removed from the end",
    )
    args = parser.parse_args(argv)
    try:
        with Store.open(args.db, readonly=True) as store:
            if args.command == "head":
                anchor = store.audit_head()
                print(anchor if anchor else "empty")
                return 0
            result = store.verify_audit(args.anchor)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
