"""``python -m slurm_recovery.cli`` = ``srecovery``."""

from slurm_recovery.cli import main

main()
