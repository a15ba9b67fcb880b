"""Slurm for the labs (host side, standard library and Slurm's own commands only).

script: the sbatch script of a lab run (one torchrun per node, c10d rendezvous on the first);
jobs: sbatch, scontrol, squeue, sacct and scancel as plscale calls them; follow: a job from
the login node, from pending to its summary. `plscale slurm` (plscale/cli/slurm.py) uses them;
docs/slurm.md is the guide.
"""
