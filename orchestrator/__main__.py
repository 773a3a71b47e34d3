"""`python -m orchestrator`: the `dflash` command."""

from orchestrator.cli import main

main()
