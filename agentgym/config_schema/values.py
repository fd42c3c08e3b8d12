"""A value against its field: the type checks ``agentgym.config.compose`` runs on every key, and the
structured config it returns."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentgym.config_schema.fields import ConfigError, Leaf, choice_error, leaves, sections

_KINDS = {"bool": "true or false", "int": "a number", "float": "a number", "str": "a string", "list": "a list"}


def check_value(key: str, value: Any, where: str, leaf: Leaf | None, default: Any = None, free: bool = False) -> Any:
    """``value`` checked against its field's type (``leaf``; without one, against the type of ``default``, a
    schema file's value; ``free``: a key under an open section, anything goes): ints become floats where a
    float is expected, a whole float an int where an int is. Raises ``ConfigError`` naming ``where``."""
    if leaf is not None:
        return _check_field(key, value, leaf, where)
    if default is None or value is None or free:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key} takes true or false, got {value!r} (from {where})")
    elif isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} takes a number, got {value!r} (from {where})")
        if isinstance(default, float):
            return float(value)
    elif isinstance(default, str):
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} takes a string, got {value!r} (from {where})")
        return str(value)
    elif isinstance(default, list) and not isinstance(value, list):
        return [value]
    return value


def _number(key: str, value: Any, kind: str, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} takes a number, got {value!r} (from {where})")
    if kind == "float":
        return float(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{key} takes a whole number, got {value!r} (from {where})")
        return int(value)
    return value


def _check_field(key: str, value: Any, leaf: Leaf, where: str) -> Any:
    kind = leaf.kind
    if value is None:
        if leaf.optional:
            return None
        what = _KINDS.get(
            kind, "one of " + ", ".join(str(c) for c in leaf.choices or ()) if kind == "choice" else "a value"
        )
        raise ConfigError(
            f"{key} takes {what}, not null (from {where}); leave it out to keep its default {leaf.default!r}"
        )
    if kind == "choice":
        if value not in leaf.choices:  # type: ignore[operator]
            raise choice_error(key, value, leaf.choices)  # type: ignore[arg-type]
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{key} takes true or false, got {value!r} (from {where})")
        return value
    if kind in ("int", "float"):
        return _number(key, value, kind, where)
    if kind == "str":
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} takes a string, got {value!r} (from {where})")
        return str(value)
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        item = leaf.item_type
        if item in (int, float):
            return [_number(f"{key} item", v, item.__name__, where) for v in items]
        if item is str:
            return [str(v) if not isinstance(v, (dict, list)) else v for v in items]
        return items
    if kind == "dict" and not isinstance(value, dict):
        raise ConfigError(f"{key} takes a mapping (e.g. {{a: 1}}), got {value!r} (from {where})")
    return value


def structured(schema_cls: type, cfg: DictConfig, added: dict[str, Any]) -> DictConfig:
    """``cfg`` (checked and resolved) as a structured config of ``schema_cls``; ``added`` (``+key``) kept."""
    values = OmegaConf.to_container(cfg, resolve=True)
    for key in added:  # put back after the merge: the schema has no place for them
        parent, _, leaf = key.rpartition(".")
        node = _lookup(values, parent) if parent else values
        if isinstance(node, dict):
            node.pop(leaf, None)
    typed = OmegaConf.structured(schema_cls)
    for key, (_, is_open) in sections(schema_cls).items():
        if is_open:
            OmegaConf.set_struct(OmegaConf.select(typed, key), False)
    try:
        typed = OmegaConf.merge(typed, values)
        for key, leaf in leaves(schema_cls).items():  # a mapping is replaced, not merged (as deep_merge does)
            if leaf.kind == "dict" and _lookup(values, key) is not None:
                OmegaConf.update(typed, key, _lookup(values, key), merge=False)
        for key, value in added.items():
            OmegaConf.update(typed, key, value, merge=False, force_add=True)
    except OmegaConfBaseException as exc:
        where = getattr(exc, "full_key", None) or "the config"
        raise ConfigError(f"{where}: {str(exc).splitlines()[0]}") from exc
    return typed


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data
