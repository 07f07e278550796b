"""transit-launch: transparent scale-in for PyTorch training on Slurm clusters."""

__version__ = "0.1.0"
