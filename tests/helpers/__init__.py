"""Helpers the test modules import: real parts to test against, and ways to drive the CLI.

Test modules import from here, never from one another or from ``conftest.py`` (which holds
only fixtures, built on these helpers). Tiny model checkpoints come from the product's own
catalogue, `orchestrator.demo.architectures`, which the demo uses too; what the benchmarks
share with the tests (loopback sshd, scripted HTTP servers, real vLLM and Slurm on
loopback, the reference online loop) lives beside it in `orchestrator.demo`, and the
modules here of those names only give the tests its names (and their skips).
"""
