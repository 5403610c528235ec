"""The knob schema of every policy, read from its attrs class: the one source both CLIs build from.

A knob is a field of a policy class other than the run's shape (P, R and the length bound, which the
CLIs take as top-level flags).  Its name, type and default come from `attrs.fields`; its help text
is the docstring under the field (the project's way of documenting a field), read from the class
source.  So a knob added to a policy class, with its docstring, appears in `rollpacker simulate`
(`--name`) and in the reference trainer (`--policy.name`) with no other edit.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
import typing

import attrs
from attrs import frozen

RUN_SHAPE = ("prompts", "samples", "max_tokens")
"""Fields every policy has that the CLIs set as top-level flags, not as knobs."""


@frozen
class Knob:
    name: str
    type: typing.Any
    """The field's resolved annotation: float, int | None, bool, Literal["a", "b"], ..."""
    default: typing.Any
    help: str
    """The field's docstring ("" when it has none)."""

    @property
    def value_type(self) -> type:
        """The type one value parses to: int for `int | None`, str for a Literal."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        if typing.get_origin(self.type) is typing.Literal:
            return type(args[0])
        if isinstance(self.type, types.UnionType) or typing.get_origin(self.type) is typing.Union:
            (only,) = args
            return only
        return self.type

    @property
    def choices(self) -> tuple | None:
        """The allowed values of a Literal knob, else None."""
        return typing.get_args(self.type) if typing.get_origin(self.type) is typing.Literal else None

    @property
    def flag(self) -> str:
        """The knob's name on a command line: eta_prompts -> eta-prompts."""
        return self.name.replace("_", "-")

    @property
    def paragraph(self) -> str:
        """The help text as one paragraph, as both CLIs show it."""
        return " ".join(self.help.split())


@frozen
class KnobSection:
    """The flags of one registered class, `--NAME.KNOB` each, under a title: what both CLIs list for a
    policy (and the trainer for a registered engine or trainer), so its knobs and help read alike."""

    name: str
    """The section, the name the class is registered under."""
    title: str
    """"Knobs of --policy tail (RollPacker's tail batching).", from the class docstring's first line."""
    knobs: tuple[Knob, ...]


def knob_section(kind: str, name: str, cls: type) -> KnobSection:
    """The section of `cls`, registered as `--KIND NAME` (kind: policy, rollout or trainer)."""
    about = (cls.__doc__ or "").strip().split("\n")[0].rstrip(".")
    return KnobSection(name, f"Knobs of --{kind} {name}" + (f" ({about})." if about else "."), knobs_of(cls))


def knobs_of(cls: type) -> tuple[Knob, ...]:
    """The knobs of policy class `cls`, in field order."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    return tuple(Knob(f.name, hints[f.name], f.default, docs.get(f.name, ""))
                 for f in attrs.fields(cls) if f.name not in RUN_SHAPE)


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it, over `cls` and its bases (a subclass's wins), cleaned."""
    return {name: inspect.cleandoc(doc) for name, doc in source_docstrings(cls).items()}


@functools.cache
def source_docstrings(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it as written (indented continuation lines), over `cls` and
    its bases: the text tyro reads from a class's source, so help built from it renders alike."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (built in a REPL): no help text
            continue
        body = tree.body[0].body
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = after.value.value
    return docs
