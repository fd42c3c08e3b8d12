"""``--env-arg KEY=VALUE`` pairs -> env constructor arguments (every command that builds an env)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def parse_env_args(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["dim_room=[8,8]", "num_boxes=2"]`` -> kwargs, values read as YAML scalars/lists.
    Raises ``ValueError`` naming the malformed pair."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-arg expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out
