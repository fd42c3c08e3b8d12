"""``--env-arg KEY=VALUE`` pairs -> env constructor arguments (every command that builds an env).

VALUE is read as YAML, as config overrides are: ``max_steps=20`` is an int, ``dim_room=[6,6]`` a list,
``offer_tools=false`` a bool, ``system_prompt=null`` None (for most envs: their default). Nothing after
the ``=`` is the empty string, as in Hydra: ``--env-arg system_prompt=`` gives ``""`` (no system
prompt), not None; so do the quoted YAML forms ``"system_prompt=''"`` and ``'system_prompt=""'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HELP = (
    "env constructor argument (repeatable); VALUE is YAML: 20, [6,6], false, null (None: the env's "
    "default); KEY= with nothing after '=' is the empty string (agentgym/envs/env_args.py)"
)
"""The help of every command's ``--env-arg``."""


def parse_env_args(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["dim_room=[8,8]", "num_boxes=2", "system_prompt="]`` -> ``{"dim_room": [8, 8], "num_boxes": 2,
    "system_prompt": ""}``. Raises ``ValueError`` naming the malformed pair."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-arg expects KEY=VALUE, got {pair!r}")
        if not value.strip():
            out[key.strip()] = ""  # YAML would read nothing as null
            continue
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ValueError(
                f"--env-arg {pair!r}: the value is not YAML ({exc.__class__.__name__}); quote a plain "
                f"string for YAML, e.g. --env-arg \"{key.strip()}='{value}'\""
            ) from None
    return out
