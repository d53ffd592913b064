"""slurm-recovery: keeps multi-node GPU training running on Slurm clusters."""

__version__ = "0.1.0.dev0"
