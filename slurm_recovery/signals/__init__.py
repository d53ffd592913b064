"""Signals from job logs: the log signature catalogue, the scanner and log attribution.

See :mod:`slurm_recovery.signals.logs` and docs/signatures.md.
"""

from slurm_recovery.signals.logs import (
    LogVerdict,
    Match,
    SignatureCatalogue,
    SignatureError,
    classify,
    evidence_payload,
    load_signatures,
    scan,
)

__all__ = [
    "LogVerdict",
    "Match",
    "SignatureCatalogue",
    "SignatureError",
    "classify",
    "evidence_payload",
    "load_signatures",
    "scan",
]
