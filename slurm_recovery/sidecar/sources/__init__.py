"""Signal sources of the sidecar that are not GPU backends, one module each.

- ``kmsg``: NVIDIA XIDs from the kernel log (/dev/kmsg), deduplicated across restarts.
- ``infiniband``: InfiniBand / RoCE port state and error counters from sysfs, debounced.

Each is a :class:`~slurm_recovery.sidecar.base.Source`; the GPU backends live in
``slurm_recovery.sidecar.gpu``.
"""

from slurm_recovery.sidecar.sources.infiniband import InfinibandSource
from slurm_recovery.sidecar.sources.kmsg import KmsgSource

__all__ = ["InfinibandSource", "KmsgSource"]
