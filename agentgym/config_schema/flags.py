"""Command-line flags that set what a config field sets: their type, choices and help come from the field.

``agentgym rollout --temperature`` is ``actor_rollout_ref.rollout.temperature`` outside a training run; declaring
it with ``config_flag`` keeps the two from drifting apart (a renamed or retyped field changes the flag, and a
field that is gone fails when the parser is built, which every command's parser test does).
"""

from __future__ import annotations

import argparse
from typing import Any

from agentgym.config_schema.fields import leaves
from agentgym.config_schema.train import TrainConfig

_PYTHON_TYPES = {"int": int, "float": float, "str": str}


def config_flag(parser: Any, *flags: str, key: str, schema: type = TrainConfig, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(*flags, ...)`` for the field ``key`` of ``schema``: its choices (a ``Literal``) or
    type, its default, and its help text after the flag's own (``help=``). Any argparse keyword given wins:
    a command whose default differs from the config's says so with ``default=``."""
    leaf = leaves(schema).get(key)
    if leaf is None:
        raise KeyError(f"{flags[0]}: {key} is not a field of {schema.__name__}")
    if leaf.choices is not None:
        kwargs.setdefault("choices", [c for c in leaf.choices if c is not None])
    elif leaf.kind in _PYTHON_TYPES and kwargs.get("action") not in ("store_true", "store_false"):
        kwargs.setdefault("type", _PYTHON_TYPES[leaf.kind])
    kwargs.setdefault("default", leaf.default)
    own = kwargs.pop("help", None)
    field_help = leaf.help.replace("%", "%%")
    shown = "" if kwargs["default"] is None else " (default: %(default)s)"
    kwargs["help"] = f"{own + '; ' if own else ''}as {key}: {field_help}{shown}"
    return parser.add_argument(*flags, **kwargs)
