"""Plugins: modules that register a policy, a rollout engine or a trainer before the CLIs read the
registries.  `ROLLPACKER_PLUGINS=mypkg.policies,mypkg.engines` names them (comma-separated, each on
the Python path); both `rollpacker simulate` and reference/train.py import them first, so a
registered name is a choice of --policy / --rollout / --trainer and its options are flags.

    register_policy("foo", FooPolicy)                   rollpacker.core.policies (no torch)
    register_rollout("foo", FooRollout)                 rollpacker.train.registry
    register_trainer("foo", FooTrainer)                 rollpacker.train.registry

A run saves the modules it was started with (state/config.json), so a resume without them names the
variable and the modules to set.
"""

from __future__ import annotations

import importlib
import os
import traceback

from rollpacker.core.errors import ConfigError, RollpackerError

PLUGINS_ENV = "ROLLPACKER_PLUGINS"
SAVED_KEY = "plugins"
"""The key of state/config.json that holds the plugin modules a run was started with."""


def plugin_modules() -> list[str]:
    """The module names in $ROLLPACKER_PLUGINS, in order."""
    return [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]


def load_plugins() -> list[str]:
    """Import every module named in $ROLLPACKER_PLUGINS (once each: Python caches imports); a module
    that does not import, or raises while it does, is one ConfigError naming it, the variable and
    where it raised (a RollpackerError it raises, e.g. a refused registration, is kept as it is)."""
    names = plugin_modules()
    for name in names:
        try:
            importlib.import_module(name)
        except RollpackerError:
            raise
        except ImportError as exc:
            raise ConfigError(f"{PLUGINS_ENV}: plugin module {name!r} does not import ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - the plugin's own bug: say where, not a traceback
            raise ConfigError(f"{PLUGINS_ENV}: plugin module {name!r} raised on import: "
                              f"{type(exc).__name__}: {_first_line(exc)}{_where(exc)}") from None
    return names


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _where(exc: BaseException) -> str:
    """` (FILE line N)` of the innermost frame that raised, if it is one of the plugin's (a
    SyntaxError names its own file and line)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)[1:]  # [0]: our import_module call
              if f.filename != importlib.__file__ and not f.filename.startswith("<frozen")]
    return f" ({frames[-1].filename} line {frames[-1].lineno})" if frames else ""
