"""The local controller: inventory, SSH hosts, relay, remote jobs, results.

Never imports torch: `dflash --help`, `relay` and `hosts` work on a laptop without it.
"""

__version__ = "0.1.0"
# The distribution's name (pyproject's [project] name). Not "dflash": on PyPI that is z-lab's
# DFlash reference package, which drafter teams install for its model code. The command
# stays `dflash`.
DISTRIBUTION = "dflash-orchestrator"
