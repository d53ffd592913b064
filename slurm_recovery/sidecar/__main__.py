"""``python -m slurm_recovery.sidecar`` = ``srecovery-sidecar``."""

from slurm_recovery.sidecar.daemon import main

main()
