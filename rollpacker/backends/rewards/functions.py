"""`--reward NAME|module:function`: what scores a response, run inside the reward worker processes.

    math            math-verify: is the ground truth (a number or LaTeX) in the response?
    reasoning-gym   the task's own `score_answer` (data_source names one of rollpacker's tasks)
    module:function a user function with veRL's signature
                    compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict
                    (module: a dotted name importable from the working directory, or a .py path)

A dict result's "score" is the reward and its other numeric keys are metrics (the executor averages
them per step).  The workers call `score(reward, data_source, entry, response)` with
entry = {"ground_truth": ..., "extra_info": ...}; whatever the function does wrong (raises, hangs,
returns NaN) the executor turns into a recorded failure with reward 0 (see rewards.py).
`check_reward` imports a user function in the parent first, so a bad --reward is one line before
the model loads.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import numbers
import os
import sys
from collections.abc import Callable, Mapping
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from rollpacker.core.errors import ConfigError

BUILTIN = ("math", "reasoning-gym")
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


def check_reward(reward: str) -> None:
    """Raise a ConfigError naming --reward unless `reward` is a built-in or a user function that
    takes veRL's four arguments."""
    if reward in BUILTIN:
        return
    if ":" not in reward:
        raise ConfigError(f"--reward {reward!r}: not one of {', '.join(BUILTIN)}, nor module:function "
                          f"(e.g. my_rewards.py:compute_score)")
    fn = user_function(reward)
    try:
        inspect.signature(fn).bind(**{name: None for name in VERL_ARGS})
    except TypeError as exc:
        raise ConfigError(f"--reward {reward}: the function must take ({', '.join(VERL_ARGS)}) as veRL's "
                          f"compute_score does ({exc})") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass


@lru_cache(maxsize=None)
def user_function(reward: str) -> Callable[..., Any]:
    """The function `reward` ("module:function" or "path/file.py:function") names."""
    module_name, _, fn_name = reward.rpartition(":")
    try:
        module = _import(module_name)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module: any failure is a bad --reward
        raise ConfigError(f"--reward {reward}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"--reward {reward}: {module_name!r} has no function {fn_name!r}")
    return fn


def _import(module_name: str):
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"--reward {module_name}: no such file")
        spec = importlib.util.spec_from_file_location(f"rollpacker_user_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:  # `my_rewards:fn` from the directory the run starts in
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"--reward {module_name}: no module named {exc.name!r} (run from its directory, "
                              f"or give a path such as path/to/{exc.name}.py:compute_score)") from None
        raise


def check_rows(reward: str, rows) -> None:
    """--reward reasoning-gym scores with the task `data_source` names: every row must name one."""
    if reward != "reasoning-gym":
        return
    from rollpacker.backends.data.tasks import TASKS

    for row in rows:
        if row.data_source not in TASKS:
            raise ConfigError(f"--reward reasoning-gym: {row.where}: key data_source is {row.data_source!r}, not one "
                              f"of its tasks ({', '.join(sorted(TASKS))}); use --reward math or a function")


def scorer(reward: str) -> Callable[[str, Any, str], Any]:
    """The picklable (data_source, entry, response) -> float | dict that workers run."""
    return partial(score, reward)


def warmup(reward: str) -> Callable[[], None]:
    """What a worker runs before its first job (imports), so no deadline is spent on them."""
    return partial(warm_up, reward)


def warm_up(reward: str) -> None:
    from rollpacker.backends.data import tasks

    if reward in BUILTIN:
        tasks.warm_up()
    else:
        user_function(reward)


def score(reward: str, data_source: str, entry: Mapping[str, Any], response: str) -> Any:
    """The reward of `response` (a float, or a user function's dict)."""
    from rollpacker.backends.data import tasks

    ground_truth, extra_info = entry["ground_truth"], entry["extra_info"]
    if reward == "math":
        return tasks.math_verify_score(str(ground_truth), response)
    if reward == "reasoning-gym":
        task_entry = extra_info.get("entry") or {"answer": str(ground_truth), "metadata": extra_info.get("metadata") or {}}
        return tasks.score(data_source, task_entry, response)
    return user_function(reward)(data_source=data_source, solution_str=response, ground_truth=ground_truth,
                                 extra_info=extra_info)


def split_result(result: Any) -> tuple[float, dict[str, float]]:
    """(reward, metrics) of what a scorer returned: a number (an int or a float, not a bool or a
    numeric string), or a dict with such a "score" and metrics (its other numeric values, booleans
    as 0/1; anything else in it is not a metric)."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"the reward function returned a dict without 'score' (keys: {', '.join(map(str, result))})")
        metrics = {str(k): float(v) for k, v in result.items()
                   if k != "score" and isinstance(v, (int, float))}
        return _number(result["score"], "its 'score'"), metrics
    return _number(result, "it"), {}


def _number(value: Any, what: str) -> float:
    """`value` as a float if it is a number: an int or a float (numpy's too), never a bool or a
    string, whatever `float()` would make of them."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} is a {type(value).__name__}, not a number (a reward function returns an int, "
                         f"a float or a dict with a numeric 'score')")
    return float(value)
