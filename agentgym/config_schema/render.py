"""A schema as commented YAML: ``configs/train.yaml`` is this, written by ``python -m agentgym.config_schema``."""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from typing import Any

import yaml

from agentgym.config_schema.fields import _hints, _split_optional, is_section

WIDTH = 120
COMMENT_COLUMN = 32  # comments start here unless the line is longer


def scalar(value: Any) -> str:
    """``value`` as one line of YAML (flow style for lists and mappings)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _line(text: str, help: str) -> list[str]:  # noqa: A002
    if not help:
        return [text]
    column = max(COMMENT_COLUMN, len(text) + 2)
    if column > WIDTH - 30:  # a long value: the comment goes on the lines above
        indent = " " * (len(text) - len(text.lstrip()))
        return [indent + "# " + part for part in textwrap.wrap(help, WIDTH - len(indent) - 2)] + [text]
    parts = textwrap.wrap(help, WIDTH - column - 2, break_on_hyphens=False) or [""]
    lines = [text.ljust(column) + "# " + parts[0]]
    lines += [" " * column + "# " + part for part in parts[1:]]
    return lines


def _render(instance: Any, indent: int) -> list[str]:
    lines: list[str] = []
    cls = type(instance)
    hints = _hints(cls)
    pad = "  " * indent
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        hint, _ = _split_optional(hints[f.name])
        help_text = f.metadata.get("help", "")
        if is_section(hint):
            lines += _line(f"{pad}{f.name}:", help_text)
            lines += _render(value, indent + 1)
        else:
            lines += _line(f"{pad}{f.name}: {scalar(value)}", help_text)
    return lines


def to_yaml(schema: type, header: str = "", groups: type | None = None) -> str:
    """The schema's defaults as YAML, every key with its help text as a comment; ``groups``: the ``defaults:``
    mapping first; ``header``: a comment block on top."""
    lines = ["# " + line if line else "#" for line in header.splitlines()]
    if groups is not None:
        lines += ["defaults:"] + _render(groups(), 1)
    instance = schema()
    for f in dataclasses.fields(schema):
        lines.append("")
        help_text = f.metadata.get("help", "")
        lines += _line(f"{f.name}:", help_text)
        hint, _ = _split_optional(typing.get_type_hints(schema)[f.name])
        lines += _render(getattr(instance, f.name), 1) if is_section(hint) else []
    return "\n".join(lines) + "\n"
