"""A key against the schema: every unknown key of a composition reported at once, each with the closest
valid key named; keys under an open section (``OPEN_SECTIONS``) pass; another system's keys go to a key
policy (``agentgym.compat``)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config_schema.fields import ConfigError

# Sections whose keys are free: passed through to a constructor, an engine or ray.init.
OPEN_SECTIONS = (
    "env.kwargs",
    "env.val_kwargs",
    "ray_init",
    "actor_rollout_ref.rollout.engine_kwargs",
    "data.apply_chat_template_kwargs",
    "env.custom_envs",
    "reward_model.reward_kwargs",
    "warm_start.sft",
)  # warm_start.sft: configs/sft.yaml's keys, checked by the warm start

KeyPolicy = Callable[[str, Any], "tuple[str, str] | None"]
"""``(key, value) -> (verdict, text)`` for a key train.yaml lacks, or None (a typo): ``("ignore",
reason)`` accepts it with no effect, ``("refuse", reason)`` rejects it, ``("alias", other_key)``
sets ``other_key`` instead (another system's name for a key agentgym has)."""


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (empty mappings stay as leaves)."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=False)
    out: dict[str, Any] = {}
    if isinstance(node, dict) and node:
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    else:
        out[prefix] = node
    return out


def is_open(key: str) -> bool:
    return any(key == s or key.startswith(s + ".") for s in OPEN_SECTIONS)


def closest_key(key: str, known: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the most likely intended key, or ``""``. A right leaf name under
    a wrong section names every place that leaf is a key (the misplaced-key case)."""
    known = list(known)
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        places = sorted(same_leaf, key=lambda k: -difflib.SequenceMatcher(None, key, k).ratio())[:3]
        return " Did you mean " + " or ".join(repr(p) for p in places) + "?"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) or difflib.get_close_matches(
        key, known, n=1, cutoff=0.3
    )
    return f" Did you mean {close[0]!r}?" if close else ""


def _prefixes(schema: Iterable[str]) -> set[str]:
    return {k.rsplit(".", i)[0] for k in schema for i in range(1, k.count(".") + 1)}


class KeyReport:
    """Collects every unknown key of a composition, so all are reported at once."""

    def __init__(self, schema: dict[str, Any], policy: KeyPolicy | None) -> None:
        self.known = set(schema)
        self.prefixes = _prefixes(schema)
        self.policy = policy
        self.errors: list[str] = []
        self.ignored: dict[str, str] = {}

    def check(self, key: str, value: Any, where: str, add_hint: bool = False) -> str | None:
        """The key to set for ``key`` (itself, or what it is an alias of), or None when it is not
        set: an unknown key is recorded (an error, or ignored by the policy)."""
        if not key or key in self.known or is_open(key) or key in self.prefixes:
            return key
        verdict = self.policy(key, value) if self.policy is not None else None
        if verdict is not None and verdict[0] == "alias":
            return verdict[1]
        if verdict is not None and verdict[0] == "ignore":
            self.ignored[key] = verdict[1]
            return None
        if verdict is not None:
            self.errors.append(f"{key} (from {where}): {verdict[1]}")
            return None
        extra = f" To add a key on purpose, write +{key}=..." if add_hint else ""
        self.errors.append(f"unknown config key {key!r} (from {where}).{closest_key(key, self.known)}{extra}")
        return None

    def check_mapping(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        """``data`` without the keys the policy ignores, aliases renamed (errors are recorded). The policy
        judges each value with the file's own interpolations resolved (a dumped veRL config writes
        ``${oc.select:...}`` for values that are harmless once resolved); the values kept stay as written."""
        keep: dict[str, Any] = {}
        view = flatten(resolved_where_possible(data))
        for key, value in flatten(data).items():
            target = self.check(key, view.get(key, value), where)
            if target is not None:
                keep[target] = value
        return _unflatten(keep)

    def raise_errors(self) -> None:
        if len(self.errors) == 1:
            raise ConfigError(self.errors[0])
        if self.errors:
            raise ConfigError(f"{len(self.errors)} config keys cannot be used:\n  " + "\n  ".join(self.errors))


def resolved_where_possible(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each ``${...}`` resolved within ``data`` itself where it can be (others left as written)."""
    conf = OmegaConf.create(data)
    try:
        return OmegaConf.to_container(conf, resolve=True)
    except Exception:  # noqa: BLE001 - some interpolation points outside the file: resolve key by key
        pass
    out: dict[str, Any] = {}
    for key, value in flatten(data).items():
        if isinstance(value, str) and "${" in value:
            try:
                value = OmegaConf.select(conf, key, throw_on_resolution_failure=True)
                value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            except Exception:  # noqa: BLE001 - kept as written
                pass
        out[key] = value
    return _unflatten(out)


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def check_keys(data: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    """Every key in ``data`` must be a key of ``schema`` or under an open section."""
    report = KeyReport(schema, None)
    report.check_mapping(data, where)
    report.raise_errors()
