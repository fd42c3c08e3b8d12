"""Another system's config given to ``agentgym train`` as it is: a ROLL or ChatLearn file (``--config``,
``--config-file``, Hydra's ``--config-path``/``--config-name``) or their keys on the command line
(ChatLearn's launch scripts pass ``runtime_args.*`` and ``models.*``; ROLL's ``pretrain=...``).

``system_of(data)`` tells whose a file is by its top-level keys; ``split_overrides`` sends each
command-line item either to agentgym (a key of ``train.yaml``, a veRL key, a group choice) or to the
other system's file, where ``merge_overrides`` applies it as Hydra would before the file is translated
(``agentgym.compat.roll`` / ``systems``), exactly as ``agentgym config --from`` translates it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from agentgym.config import GROUPS, is_removal, parse_value

CHATLEARN_ROOTS = ("runtime_args", "models")
ROLL_MARKERS = (
    "custom_envs",
    "train_env_manager",
    "val_env_manager",
    "actor_train",
    "actor_infer",
    "pretrain",
    "rollout_batch_size",
    "custom_env",
)
CLAW_ROLLOUT_KEYS = ("nnodes", "n_gpus_per_node")  # agentgym's own rollout-pool keys


def system_of(data: dict[str, Any]) -> str | None:
    """``chatlearn``, ``roll``, ``claw-r1`` or ``verl`` for a file in that system's shape (``verl``: a Hydra
    ``defaults`` list, as veRL's recipes have, or veRL's ``_target_`` classes, as its dumped configs have),
    None for agentgym's own shape."""
    if (
        any(k in data for k in CHATLEARN_ROOTS)
        and isinstance(data.get("models", {}), dict)
        and ("runtime_args" in data or "policy_trainer" in (data.get("models") or {}))
    ):
        return "chatlearn"
    if any(k in data for k in ROLL_MARKERS):
        return "roll"
    rollout = data.get("rollout")
    if isinstance(rollout, dict) and set(rollout) - set(CLAW_ROLLOUT_KEYS):
        return "claw-r1"
    if isinstance(data.get("defaults"), list) or _has_verl_target(data):
        return "verl"
    return None


def _has_verl_target(node: Any) -> bool:
    """Whether a config holds veRL's ``_target_: verl....`` (a dumped veRL config: the run's or
    ``_generated_ppo_trainer.yaml``)."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and target.startswith("verl."):
            return True
        return any(_has_verl_target(v) for v in node.values())
    return False


def override_system(key: str, ours: Callable[[str], bool]) -> str | None:
    """Whose key a command-line ``key`` is when no file says: ChatLearn's roots, a ROLL marker, else None."""
    root = key.split(".", 1)[0]
    if ours(key):
        return None
    if root in CHATLEARN_ROOTS:
        return "chatlearn"
    if root in ROLL_MARKERS:
        return "roll"
    return None


def split_overrides(
    overrides: Sequence[str], system: str | None, ours: Callable[[str], bool]
) -> tuple[str | None, list[str], list[str]]:
    """``(system, theirs, agentgym's)``: with a file of another ``system`` every item agentgym does not know
    is theirs; without one, items under another system's roots make it theirs."""
    theirs: list[str] = []
    mine: list[str] = []
    for item in overrides:
        key = item.strip().lstrip("~+").partition("=")[0].strip()
        if key in GROUPS or ours(key):
            mine.append(item)
            continue
        owner = system or override_system(key, ours)
        if owner in ("roll", "chatlearn"):
            system = owner
            theirs.append(item)
        else:
            mine.append(item)
    return system, theirs, mine


def merge_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` with Hydra-style ``key=value`` / ``+key=value`` / ``~key`` items applied (a copy)."""
    out = copy.deepcopy(data)
    for item in overrides:
        if is_removal(item):
            parts = item.strip().lstrip("~").partition("=")[0].strip().split(".")
            node = _walk(out, parts[:-1], create=False)
            if isinstance(node, dict):
                node.pop(parts[-1], None)
            continue
        key, _, text = item.partition("=")
        parts = key.strip().lstrip("+").split(".")
        _walk(out, parts[:-1], create=True)[parts[-1]] = parse_value(text)
    return out


def _walk(data: dict[str, Any], parts: Sequence[str], create: bool) -> Any:
    node: Any = data
    for part in parts:
        if not isinstance(node, dict):
            return None
        if part not in node or not isinstance(node[part], dict):
            if not create:
                return None
            node[part] = {}
        node = node[part]
    return node
