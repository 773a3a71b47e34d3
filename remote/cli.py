"""Entry point of the remote bundle: ``python dflash-remote-<hash>.pyz COMMAND ...``.

Each command lives in its own module exposing ``register(subparsers)``; the module is
imported only when listed here, and heavy imports (torch) happen inside the command.
Commands print JSON on stdout (one document, or JSON lines for progress events) so the
controller never scrapes human text.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from remote.errors import ERROR_PREFIX, EXIT_USER_ERROR, UserError

COMMAND_MODULES = (
    "remote.facts",
    "remote.probe",
    "remote.jobs",
    "remote.preflight",
    "remote.evaluate",
    "remote.relay",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-remote", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(ERROR_PREFIX + str(exc), file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
