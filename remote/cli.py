"""Entry point of the remote bundle: ``python dflash-remote-<hash>.pyz COMMAND ...``; each
command a module with ``register(subparsers)`` (docs/development.md)."""

from __future__ import annotations

import argparse
import importlib
import sys

from remote.errors import ERROR_PREFIX, EXIT_USER_ERROR, UserError

RELAY_MODULES = {
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


# known by their name's prefix, so a short host-side process imports only its module
PREFIX_MODULES = {**RELAY_MODULES, "job": "remote.jobs.command"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with only `command`'s module where its name says which."""
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
