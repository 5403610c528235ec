"""The `rollpacker` console script: one subcommand per module, each registering its own arguments.

    rollpacker serve --model PATH --port 30000     # the embedded engine behind SGLang's HTTP API

A subcommand is a pair (add_arguments(parser), run(args) -> int) living in its own module; this file
only dispatches, and imports a subcommand's module (and its heavy dependencies) only when chosen.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help).  The module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = {
    "serve": ("rollpacker.backends.serve", "serve the embedded engine through SGLang's native HTTP API"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollpacker")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        sub_parser.set_defaults(_module=module)
        # Cheap: a subcommand module's top level imports only argparse-level things.
        importlib.import_module(module).add_arguments(sub_parser)
    args = parser.parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
