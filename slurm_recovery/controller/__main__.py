"""``python -m slurm_recovery.controller`` = ``srecovery-controller``."""

from slurm_recovery.controller import main

main()
