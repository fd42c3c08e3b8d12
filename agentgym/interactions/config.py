"""Build interactions from veRL's interaction YAML.

The file has veRL's shape (``actor_rollout_ref.rollout.multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k                         # what a row's interaction_kwargs.name refers to
        class_name: agentgym.interactions.gsm8k.Gsm8kInteraction
        config: {max_turns: 3}

``class_name`` is a dotted import path (``pkg.module.Class`` or ``pkg.module:Class``) or the
name of an interaction registered in the ``agentgym.interactions`` group (``gsm8k``). As in veRL,
``name`` defaults to the class name without its ``Interaction`` suffix, lower-cased, and is
added to the config the class is built with.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym.registry import INTERACTIONS


class InteractionConfigError(ValueError):
    """An interaction YAML entry is malformed or names a class that cannot be found."""


VERL_BUILTINS = {"verl.interactions.gsm8k_interaction.Gsm8kInteraction": "gsm8k"}
"""veRL's own interaction classes -> agentgym's built-in of the same behaviour, so veRL's interaction YAML
(``examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml``) runs as written."""


def interaction_class(class_name: str) -> type:
    """The class for ``class_name``: a registered interaction name, one of veRL's built-ins
    (``VERL_BUILTINS``) or a dotted import path."""
    class_name = VERL_BUILTINS.get(class_name.replace(":", "."), class_name)
    if class_name in INTERACTIONS.names():
        return INTERACTIONS.get(class_name)
    if class_name.startswith("verl.") and importlib.util.find_spec("verl") is None:
        raise InteractionConfigError(
            f"interaction class_name {class_name!r} is veRL's, and veRL is not installed; agentgym's built-ins: "
            f"{', '.join(INTERACTIONS.names())} (veRL's {', '.join(VERL_BUILTINS)} maps to them), or a class of "
            f"your own as 'package.module.ClassName'"
        )
    module_name, sep, attr = class_name.partition(":") if ":" in class_name else class_name.rpartition(".")
    if not sep or not module_name or not attr:
        raise InteractionConfigError(
            f"interaction class_name {class_name!r} is neither a registered interaction "
            f"({', '.join(INTERACTIONS.names()) or 'none'}) nor a dotted path like 'package.module.ClassName'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InteractionConfigError(
            f"interaction class_name {class_name!r}: cannot import {module_name!r} ({exc})"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InteractionConfigError(
            f"interaction class_name {class_name!r}: module {module_name!r} has no {attr!r}"
        ) from None


def default_name(class_name: str) -> str:
    """veRL's default: ``pkg.Gsm8kInteraction`` -> ``gsm8k``; ``pkg.Judge`` -> ``judge``."""
    simple = class_name.replace(":", ".").rsplit(".", 1)[-1]
    return (
        simple[: -len("Interaction")] if simple.endswith("Interaction") and simple != "Interaction" else simple
    ).lower()


def build_interactions(config: Mapping[str, Any], source: str = "interaction config") -> dict[str, Any]:
    """``{name: instance}`` from an already-loaded config mapping with an ``interaction`` list."""
    items = config.get("interaction") if isinstance(config, Mapping) else None
    if not isinstance(items, list):
        raise InteractionConfigError(
            f"{source}: expected a top-level 'interaction:' list of {{name, class_name, config}}"
        )
    interactions: dict[str, Any] = {}
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not item.get("class_name"):
            raise InteractionConfigError(f"{source}: interaction entry {i} needs a 'class_name'")
        class_name = str(item["class_name"])
        name = str(item.get("name") or default_name(class_name))
        if name in interactions:
            raise InteractionConfigError(
                f"{source}: duplicate interaction name {name!r}; give each entry its own 'name'"
            )
        cls = interaction_class(class_name)
        instance_config = dict(item.get("config") or {})
        instance_config["name"] = name
        interactions[name] = cls(config=instance_config)
    return interactions


def load_interactions(path: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """Read an interaction YAML (or take a loaded mapping) and build every interaction in it.

    Returns ``{name: instance}``. ``${...}`` interpolations are resolved as in veRL (OmegaConf).
    """
    if isinstance(path, Mapping):
        return build_interactions(path)
    from omegaconf import OmegaConf

    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"interaction config not found: {file}")
    loaded = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
    return build_interactions(loaded if isinstance(loaded, Mapping) else {}, source=str(file))
