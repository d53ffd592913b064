"""Evidence parsers and their catalogues, below the decision core and the sidecar.

:mod:`~slurm_recovery.signals.logs`: the log signature catalogue, the scanner and log
attribution (docs/signatures.md); :mod:`~slurm_recovery.signals.xid`: NVIDIA XID lines and the
XID catalogue; :mod:`~slurm_recovery.signals.progress` and
:mod:`~slurm_recovery.signals.flight_recorder`: training progress and NCCL flight-recorder dumps.
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
