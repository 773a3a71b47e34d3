"""Slurm from the workstation: eval shards as one job array on a login node (docs/slurm.md)."""
