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

RELAY_MODULES = {  # the relay's host commands, one module each
    "relay-scan": "remote.relay.scan",
    "relay-lock": "remote.relay.lock",
    "relay-send": "remote.relay.send",
    "relay-recv": "remote.relay.receive",
    "relay-hash": "remote.relay.hashes",
    "relay-publish": "remote.relay.publish",
}
COMMAND_MODULES = (
    "remote.probe.facts",
    "remote.probe.structure",
    "remote.jobs.command",
    "remote.eval.preflight",
    "remote.eval.engine",
    *RELAY_MODULES.values(),
)


# Commands known by their name's prefix: a relay runs several short host-side processes
# (scan, lock, send, receive, hash, publish) and each skipped the probe and eval modules'
# imports (~45 ms of a ~150 ms start on the 2-core test box) and the other relay
# commands'; so does every `job` command (start, watch, pull, ...), on each eval's path.
PREFIX_MODULES = {**RELAY_MODULES, "job": "remote.jobs.command"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given the command's name, only with the module that provides it when
    the name says which (otherwise with every command)."""
    parser = argparse.ArgumentParser(prog="dflash-remote", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    names = COMMAND_MODULES
    for prefix, module in PREFIX_MODULES.items():
        if command and command.startswith(prefix):
            names = (module,)
    for name in names:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(ERROR_PREFIX + str(exc), file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
