"""How a schema is written and read: ``setting`` and ``section`` declare fields, ``leaves`` lists them.

A schema is a tree of dataclasses; each field carries its type, its default and its help text
(``metadata["help"]``). ``Optional[...]`` marks a field that may be null, ``Literal[...]`` the values a
field may take. OmegaConf turns the tree into a structured config (``OmegaConf.structured``), so the
composed config has the same types.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what to do."""


def choice_error(key: str, value: object, allowed: Sequence[object]) -> ConfigError:
    """``key=value`` is not one of ``allowed`` (the closest named)."""
    names = [str(a) for a in allowed]
    close = difflib.get_close_matches(str(value), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{key}={value!r} is not one of {', '.join(names)}.{hint}")


def setting(default: Any, help: str) -> Any:  # noqa: A002 - the metadata key argparse and TRL use
    """A leaf field: its default and what it does (the help text is also ``configs/*.yaml``'s comment)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def section(cls: type, help: str, *, open: bool = False, **defaults: Any) -> Any:  # noqa: A002
    """A nested section of type ``cls`` (``defaults``: this place's own defaults for some of its fields).
    ``open``: keys beyond ``cls``'s fields are allowed (passed through to a constructor, e.g. ``ray.init``)."""
    return field(default_factory=lambda: cls(**copy.deepcopy(defaults)), metadata={"help": help, "open": open})


@dataclass(frozen=True)
class Leaf:
    """One field of a schema, by its dotted key."""

    key: str
    type: Any  # the declared type, Optional removed
    optional: bool  # null allowed
    default: Any
    help: str
    choices: tuple[Any, ...] | None  # Literal[...] (None first when optional), else None

    @property
    def kind(self) -> str:
        """``bool``, ``int``, ``float``, ``str``, ``list``, ``dict``, ``choice`` or ``any``."""
        if self.choices is not None:
            return "choice"
        origin = typing.get_origin(self.type) or self.type
        for kind, python in (("bool", bool), ("int", int), ("float", float), ("str", str), ("list", list)):
            if origin is python:
                return kind
        return "dict" if origin is dict else "any"

    @property
    def item_type(self) -> Any:
        """A list's item type (``Any`` when not declared)."""
        args = typing.get_args(self.type)
        return args[0] if args else Any


def _split_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007 - built from a tuple
    return hint, hint is Any


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def is_section(hint: Any) -> bool:
    return dataclasses.is_dataclass(hint)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def leaves(cls: type, prefix: str = "", instance: Any = None) -> dict[str, Leaf]:
    """Every leaf field of the schema ``cls`` by dotted key, in declaration order. A section's own defaults
    (``section(cls, ..., lr=1e-5)``) are the leaves' defaults there."""
    out: dict[str, Leaf] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(instance, f.name) if instance is not None else _default(f)
        hint, optional = _split_optional(hints[f.name])
        if is_section(hint):
            out.update(leaves(hint, key, value))
            continue
        choices = None
        if typing.get_origin(hint) is Literal:
            choices = ((None,) if optional else ()) + typing.get_args(hint)
        out[key] = Leaf(key, hint, optional, copy.deepcopy(value), f.metadata.get("help", ""), choices)
    return out


def sections(cls: type, prefix: str = "") -> dict[str, tuple[str, bool]]:
    """Every section of the schema: dotted key -> (help, open)."""
    out: dict[str, tuple[str, bool]] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        hint, _ = _split_optional(hints[f.name])
        if is_section(hint):
            key = f"{prefix}.{f.name}" if prefix else f.name
            out[key] = (f.metadata.get("help", ""), bool(f.metadata.get("open")))
            out.update(sections(hint, key))
    return out


def defaults(cls: type) -> dict[str, Any]:
    """The schema's defaults as nested plain mappings (what ``configs/train.yaml`` holds)."""
    return dataclasses.asdict(cls())


def choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """Dotted key -> the values it may take, for every ``Literal`` field."""
    return {key: leaf.choices for key, leaf in leaves(cls).items() if leaf.choices is not None}
