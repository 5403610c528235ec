"""The `rollpacker` command: a small dispatcher; each subcommand lives with its subsystem.

    rollpacker simulate --workload servegen-r1 --policy tail --max-tokens 32768 --json out.json

A subsystem adds a subcommand by listing `(name, module, extra)` in COMMANDS: the module's
`add_parser(subparsers)` defines its flags and `run(args) -> int` executes it; a package it needs
that is not installed is one line naming `pip install 'rollpacker[extra]'` (see `rollpacker.extras`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rollpacker.core.errors import RollpackerError
from rollpacker.extras import missing_package_line

COMMANDS = [
    ("simulate", "rollpacker.sim.cli", "sim"),
    ("serve", "rollpacker.backends.sglang.serve", "serve"),
    ("advise", "rollpacker.advise.cli", "advise"),
]


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="rollpacker", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    runners = {}
    for name, module, _ in COMMANDS:
        mod = importlib.import_module(module)
        mod.add_parser(sub, name)
        runners[name] = mod.run
    return parser, runners


def main(argv: list[str] | None = None) -> int:
    try:
        parser, runners = build_parser()
    except RollpackerError as exc:  # e.g. a plugin module of $ROLLPACKER_PLUGINS that does not import
        print(f"rollpacker: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return runners[args.command](args)
    except RollpackerError as exc:  # a bad input: say what and where, no traceback
        print(f"rollpacker {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an extra not installed: name the pip install
        line = missing_package_line(exc, next(extra for name, _, extra in COMMANDS if name == args.command))
        if line is None:
            raise
        print(f"rollpacker {args.command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
