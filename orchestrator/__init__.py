"""The local controller: inventory, SSH hosts, relay, remote jobs, results.

Never imports torch: `dflash --help`, `relay` and `hosts` work on a laptop without it.
"""

__version__ = "0.1.0"
