"""One eval sharded across SSH hosts or a Slurm job array (docs/eval.md, docs/slurm.md)."""
