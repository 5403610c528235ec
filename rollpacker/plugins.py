"""Plugins: modules that register a policy, a rollout engine or a trainer before the CLIs read the
registries.  `ROLLPACKER_PLUGINS=mypkg.policies,mypkg.engines` names them (comma-separated, each on
the Python path); both `rollpacker simulate` and reference/train.py import them first, so a
registered name is a choice of --policy / --rollout / --trainer and its options are flags.

    register_policy("foo", FooPolicy)                   rollpacker.core.policies (no torch)
    register_rollout("foo", FooRollout)                 rollpacker.train.registry
    register_trainer("foo", FooTrainer)                 rollpacker.train.registry
"""

from __future__ import annotations

import importlib
import os

from rollpacker.core.errors import ConfigError

PLUGINS_ENV = "ROLLPACKER_PLUGINS"


def load_plugins() -> list[str]:
    """Import every module named in $ROLLPACKER_PLUGINS (once each: Python caches imports); a module
    that does not import is one ConfigError naming it and the variable."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"{PLUGINS_ENV}: plugin module {name!r} does not import ({exc})") from None
    return names
