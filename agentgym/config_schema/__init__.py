"""The configuration schemas: every key a command's config may set, with its type, default and help text.

One dataclass per section, veRL's dotted names kept (``actor_rollout_ref.actor.optim.lr``): ``train.py``
holds ``agentgym train``'s (``TrainConfig``, and ``GroupDefaults``: the group files a config starts from),
``policy.py`` its ``actor_rollout_ref`` and ``critic`` sections, ``sft.py`` ``agentgym sft``'s
(``SFTConfig``), ``generation.py`` ``agentgym generate``'s (``GenerationConfig``, veRL's main_generation) and
``evaluation.py`` ``agentgym eval data.path=FILE``'s (``EvaluationConfig``, veRL's main_eval). A package
rather than one module, so each schema reads as a file of its own beside the helpers: ``fields.py``
(declaring and listing fields), ``keys.py`` (a key against the schema), ``values.py`` (a value against its
field; the structured config), ``render.py`` (a schema as YAML).

``agentgym.config.compose`` starts from a schema's defaults, checks every key and value against its
fields, and returns a structured DictConfig of it (``cfg.a.b`` access, each value of its field's type).
``configs/train.yaml``, ``sft.yaml``, ``generation.yaml`` and ``evaluation.yaml`` are documentation written
from the schemas: ``python -m agentgym.config_schema`` rewrites them, ``--check`` says whether they are current.
"""

from __future__ import annotations

from typing import Any

from agentgym.config_schema.evaluation import EvaluationConfig
from agentgym.config_schema.fields import (
    ConfigError,
    Leaf,
    choice_error,
    choices,
    defaults,
    leaves,
    section,
    sections,
    setting,
)
from agentgym.config_schema.generation import GenerationConfig
from agentgym.config_schema.sft import SFTConfig
from agentgym.config_schema.train import GroupDefaults, TrainConfig

SCHEMAS: dict[str, tuple[type, type | None]] = {
    "train": (TrainConfig, GroupDefaults),
    "sft": (SFTConfig, None),
    "generation": (GenerationConfig, None),
    "evaluation": (EvaluationConfig, None),
}
"""Base config name -> (its schema, its group defaults): every base config in ``configs/``."""


def schema_of(base_name: str) -> type | None:
    """The schema dataclass of base config ``base_name`` (``train``), or None when there is no such base config."""
    entry = SCHEMAS.get(base_name)
    return entry[0] if entry else None


def base_defaults(base_name: str) -> dict[str, Any] | None:
    """The base config as ``configs/<base_name>.yaml`` reads: its ``defaults`` mapping, then every section."""
    entry = SCHEMAS.get(base_name)
    if entry is None:
        return None
    schema, groups = entry
    out: dict[str, Any] = {"defaults": defaults(groups)} if groups is not None else {}
    out.update(defaults(schema))
    return out


__all__ = [
    "SCHEMAS",
    "ConfigError",
    "EvaluationConfig",
    "GenerationConfig",
    "GroupDefaults",
    "SFTConfig",
    "Leaf",
    "TrainConfig",
    "base_defaults",
    "choice_error",
    "choices",
    "defaults",
    "leaves",
    "schema_of",
    "section",
    "sections",
    "setting",
]
