"""The local controller; never imports torch, so it works on a laptop without it."""

__version__ = "0.1.0"
# Not "dflash": on PyPI that is z-lab's DFlash reference package (its model code).
DISTRIBUTION = "dflash-orchestrator"
