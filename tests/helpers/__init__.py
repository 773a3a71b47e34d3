"""Helpers the test modules import: real parts to test against, and ways to drive the CLI.

Test modules import from here, never from one another or from ``conftest.py`` (which holds
only fixtures, built on these helpers). Tiny model checkpoints come from the product's own
catalogue, `orchestrator.demo.architectures`, which the demo uses too.
"""
