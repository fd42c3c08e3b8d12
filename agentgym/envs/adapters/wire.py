"""Env results made JSON-safe for the servers that carry them (``env-serve``: OpenEnv's API and MCP)."""

from __future__ import annotations

import json
from typing import Any


def jsonable(value: Any) -> Any:
    """``value`` with everything JSON cannot hold turned into plain values (numpy, tuples, sets...)."""
    return json.loads(json.dumps(value, default=_plain))


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return str(value)
