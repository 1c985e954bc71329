"""Where a step's process lives: a batch scheduler's job (``slurm``) or a
process group on this machine (``stepgroup``). Imports only ``model``."""
