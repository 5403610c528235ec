"""The registries of rollout engines and trainers (the policies' is rollpacker.core.policies.POLICIES).

An entry maps a name (a choice of --rollout / --trainer) to its config class: an attrs class whose
fields are the component's options, with validators that name the flag, a `check(run)` for rules
across flags, and `build(context)` that makes the component.  A new engine or trainer is one file
with its config class plus one `register_rollout` / `register_trainer` call (in the package, or in a
plugin module: see rollpacker.plugins).

Where the options come from: a registered class's fields become the flags `--NAME.FIELD` (a section
of RunConfig named after the entry, as the policies' knobs are).  The built-in classes set
`flat = True`: their fields are top-level flags (--engine-capacity, --sglang-urls, --tp), declared
in the class only (type, default, validator, docstring as help); rollpacker.train.config.assemble
adds them to RunConfig.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from rollpacker.core.errors import ConfigError
from rollpacker.core.policies import POLICIES
from rollpacker.plugins import PLUGINS_ENV, SAVED_KEY

from .rollouts import EmbeddedRollout, SGLangRollout
from .trainers import TitanTrainerOptions, TorchTrainerOptions

ROLLOUTS: dict[str, type] = {"embedded": EmbeddedRollout, "sglang": SGLangRollout}
"""--rollout NAME -> its config class (`build(context)` returns a RolloutEngine)."""
TRAINERS: dict[str, type] = {"titan": TitanTrainerOptions, "torch": TorchTrainerOptions}
"""--trainer NAME -> its config class (`build(context)` returns a Trainer)."""


@frozen(kw_only=True)
class BuildContext:
    """What a component's `build` gets beside its own options: the run's flags and what the session
    has loaded by then."""

    run: Any
    """The RunConfig (seed, dtype, lr, max_tokens, ...)."""
    model_dir: Path
    device: str
    """"cpu" or "cuda", resolved."""
    model: Any = None
    """The loaded HF model (the embedded engine decodes with it); None on trainer-only ranks."""
    memory_plan: Any = None
    """The run's MemoryPlan (kv tokens per row, padded tokens per forward); None without one."""


def register_rollout(name: str, config: type) -> None:
    """Add rollout engine `config` (attrs class with `build(context)`) as --rollout `name`."""
    _register(ROLLOUTS, "rollout", name, config)


def register_trainer(name: str, config: type) -> None:
    """Add trainer `config` (attrs class with `build(context)`) as --trainer `name`."""
    _register(TRAINERS, "trainer", name, config)


def _register(registry: dict, kind: str, name: str, config: type) -> None:
    if not name.isidentifier() or name in registry:
        raise ConfigError(f"{kind} name {name!r} must be a new Python identifier (registered: {', '.join(registry)})")
    if not attrs.has(config) or not callable(getattr(config, "build", None)):
        raise ConfigError(f"{kind} {name!r}: {config!r} must be an attrs class with a build(context) method")
    registry[name] = config


def values_of(config: type, source) -> dict:
    """The keyword arguments of component `config`, read from `source` (the run, or its section)."""
    return {f.name: getattr(source, f.name) for f in attrs.fields(config) if f.init}


def options_of(registry: dict, name: str, run) -> Any:
    """The config of entry `name` with its values from the run's flags (its section, or the
    top-level flags of a flat built-in); a bad value is the validator's ConfigError."""
    config = registry[name]
    options = config(**values_of(config, run if getattr(config, "flat", False) else getattr(run, name)))
    check = getattr(options, "check", None)
    if check is not None:
        check(run)
    return options


def check_registered(saved: dict, where: str) -> None:
    """A saved run's policy, rollout engine and trainer are registered here; one that is not came from
    a plugin module not imported now: a ConfigError naming the variable to set, and the modules the
    run was started with when its saved config has them (rollpacker.plugins.SAVED_KEY)."""
    for kind, registry in (("policy", POLICIES), ("rollout", ROLLOUTS), ("trainer", TRAINERS)):
        name = saved.get(kind)
        if name is not None and name not in registry:
            modules = saved.get(SAVED_KEY)
            setting = f"{PLUGINS_ENV}={','.join(modules)}" if modules else \
                f"{PLUGINS_ENV} to the module that registers it"
            raise ConfigError(f"{where}: the run's --{kind} {name!r} is not registered here (it came from a plugin "
                              f"module): set {setting} and run again")
