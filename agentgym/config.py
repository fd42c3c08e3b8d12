"""Training configuration: YAML files under ``configs/`` plus dotted ``a.b=c`` overrides.

Where the files live (one source of truth): the top-level ``configs/`` directory of the
repository. It is found, in order, at ``$AGENTGYM_CONFIG_DIR``, beside the ``agentgym``
package (``<repo>/configs``: a source checkout or an editable install), then at
``./configs`` in the working directory. A wheel install must ship that directory next to
the package or point ``AGENTGYM_CONFIG_DIR`` at a copy; ``config_dir()`` says so when it
finds none.

How a config is made (``compose_config``), later steps winning:

1. ``configs/train.yaml``: every key a run may set, with its default. Its ``defaults``
   mapping picks one file per group: ``algorithm``, ``model``, ``server``, ``env``.
2. The chosen group files, ``configs/<group>/<choice>.yaml``, merged at the top level.
   ``--env NAME`` picks ``configs/env/NAME.yaml`` when it exists, else ``env/generic.yaml``
   with ``env.name=NAME``. A bare ``group=choice`` on the command line picks another file
   (``algorithm=ppo``).
3. A named top-level config, ``configs/<config_name>.yaml`` (``agentgym train --config-name
   async_ppo_trainer``; ``--async`` picks that one): a file beside ``train.yaml`` that sets other
   defaults for some of its keys (and may carry its own ``defaults`` mapping of group choices).
   Its values may interpolate others (``${async_training.use_rollout_log_probs}``): they are
   resolved after the overrides, so an override of the source reaches the copy.
4. ``--config FILE``: a user's YAML (it may carry its own ``defaults`` mapping).
5. Command-line overrides: ``data.train_batch_size=8``, values parsed as YAML
   (``trainer.logger=[console,tensorboard]``); ``+a.b=c`` adds a key train.yaml lacks.

Every key must be one ``train.yaml`` has (a typo gets the closest valid one named) and every
value of its default's type. This module knows nothing of what the keys mean: the trainer
(``agentgym.trainer.config.load_config``) fills the defaults that follow from others and rejects
values outside their choices and batch sizes that cannot divide, before any work starts.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

GROUPS = ("algorithm", "model", "server", "env")
# Sections whose keys are free: passed through to a constructor or to ray.init.
OPEN_SECTIONS = ("env.kwargs", "env.val_kwargs", "ray_init")
class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what to do."""


# ---- finding and reading files ----------------------------------------------------------


def config_dir() -> Path:
    """The ``configs/`` directory (see the module docstring for the search order)."""
    candidates = []
    if os.environ.get("AGENTGYM_CONFIG_DIR"):
        candidates.append(Path(os.environ["AGENTGYM_CONFIG_DIR"]))
    candidates.append(Path(__file__).resolve().parents[1] / "configs")
    candidates.append(Path.cwd() / "configs")
    for candidate in candidates:
        if (candidate / "train.yaml").is_file():
            return candidate
    raise ConfigError(
        "could not find agentgym's configs/ directory (looked in: "
        + ", ".join(str(c) for c in candidates)
        + "). Run from a checkout of the repository, or set AGENTGYM_CONFIG_DIR to a copy of configs/."
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level, not {type(data).__name__}")
    return data


def group_choices(group: str, directory: Path | None = None) -> list[str]:
    """The file names (without ``.yaml``) one may pick for ``group``."""
    return sorted(p.stem for p in ((directory or config_dir()) / group).glob("*.yaml"))


def _group_file(directory: Path, group: str, choice: str) -> Path:
    path = directory / group / f"{choice}.yaml"
    if not path.is_file():
        known = group_choices(group, directory)
        close = difflib.get_close_matches(choice, known, n=1)
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        raise ConfigError(f"no config file {path}.{hint} Choices for {group}: {', '.join(known)}")
    return path


# ---- overrides ---------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A command-line value as YAML (``8``, ``true``, ``null``, ``[a,b]``); ``1e-3`` is a float."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def parse_override(item: str) -> tuple[str, Any, bool]:
    """``"+a.b=c"`` -> ``("a.b", "c", True)``: key, parsed value, whether it may add a new key."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key.lstrip("+"):
        raise ConfigError(f"an override looks like key=value (e.g. data.train_batch_size=8), got {item!r}")
    add = key.startswith("+")
    return key.lstrip("+"), parse_value(value), add


# ---- key checks --------------------------------------------------------------------------


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


def _is_open(key: str) -> bool:
    return any(key == s or key.startswith(s + ".") for s in OPEN_SECTIONS)


def _closest(key: str, known: Iterable[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:  # a right leaf name under a wrong section, or the reverse
        leaf = key.rsplit(".", 1)[-1]
        same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
        close = difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0) if same_leaf else []
    if not close:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.3)
    return f" Did you mean {close[0]!r}?" if close else ""


def check_keys(data: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    """Every key in ``data`` must be a key of ``schema`` (train.yaml) or under an open section."""
    known = set(schema)
    prefixes = {k.rsplit(".", i)[0] for k in known for i in range(1, k.count(".") + 1)}
    for key in flatten(data):
        if not key or key in known or _is_open(key):
            continue
        if key in prefixes:  # a mapping set where train.yaml has a mapping: fine (e.g. {} for a section)
            continue
        raise ConfigError(f"unknown config key {key!r} (from {where}).{_closest(key, known)}")


def _coerce(key: str, value: Any, default: Any, where: str) -> Any:
    """Check ``value`` against the default's type; ints become floats where a float is expected."""
    if default is None or value is None or _is_open(key):
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


# ---- composing -----------------------------------------------------------------------------


BASE_CONFIGS = ("train", "sft")  # whole schemas (agentgym train, agentgym sft); other top-level files overlay one


def named_configs(directory: Path | None = None) -> list[str]:
    """The named configs that overlay ``train.yaml`` (``configs/*.yaml`` other than the base files)."""
    return sorted(p.stem for p in (directory or config_dir()).glob("*.yaml") if p.stem not in BASE_CONFIGS)


def compose_config(
    env: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
    config_name: str | None = None,
    base_name: str = "train",
) -> DictConfig:
    """Compose ``<base_name>.yaml`` (``train``; ``sft`` for ``agentgym sft``), its group files, the
    named config ``config_name`` (``async_ppo_trainer``), ``config_file`` and ``overrides``; every key
    checked against the base file and every value against its default's type; interpolations
    resolved. What the values mean is checked by their user (``agentgym.trainer.config.load_config``)."""
    base_dir = Path(directory) if directory is not None else config_dir()
    base_file = base_dir / f"{base_name}.yaml"
    if not base_file.is_file():
        raise ConfigError(f"no config {base_file}; choices: "
                          f"{', '.join(sorted(p.stem for p in base_dir.glob('*.yaml')))}")
    base = _read_yaml(base_file)
    choices: dict[str, str] = dict(base.pop("defaults", {}) or {})
    schema = flatten(base)

    named: dict[str, Any] = {}
    if config_name is not None and config_name != base_name:
        path = base_dir / f"{config_name}.yaml"
        if not path.is_file() or config_name in BASE_CONFIGS:
            known = named_configs(base_dir)
            close = difflib.get_close_matches(config_name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"no config named {config_name!r} ({path} does not exist).{hint} "
                              f"Named configs: {', '.join(['train', *known])}")
        named = _read_yaml(path)
        choices.update(named.pop("defaults", {}) or {})
        check_keys(named, schema, str(path))

    user: dict[str, Any] = {}
    if config_file is not None:
        user = _read_yaml(Path(config_file))
        choices.update(user.pop("defaults", {}) or {})
        check_keys(user, schema, str(config_file))

    env_name_override: str | None = None
    if env is not None:
        if (base_dir / "env" / f"{env}.yaml").is_file():
            choices["env"] = env
        else:
            choices["env"] = "generic"
            env_name_override = env

    dotted: list[tuple[str, Any, bool]] = []
    for item in overrides:
        key, value, add = parse_override(item)
        if key in GROUPS and not add:
            if key == "env" and not (base_dir / "env" / f"{value}.yaml").is_file():
                choices["env"], env_name_override = "generic", str(value)
            else:
                choices[key] = str(value)
            continue
        dotted.append((key, value, add))

    cfg = OmegaConf.create(base)
    for group in GROUPS:
        if choices.get(group) is None:
            continue
        path = _group_file(base_dir, group, str(choices[group]))
        data = _read_yaml(path)
        check_keys(data, schema, str(path))
        cfg = OmegaConf.merge(cfg, data)
    if env_name_override is not None:
        cfg.env.name = env_name_override
    if named:
        cfg = OmegaConf.merge(cfg, named)
    if user:
        cfg = OmegaConf.merge(cfg, user)

    for key, value, add in dotted:
        if not add and key not in schema and not _is_open(key):
            prefixes = {k.rsplit(".", i)[0] for k in schema for i in range(1, k.count(".") + 1)}
            if key not in prefixes:
                raise ConfigError(
                    f"unknown config key {key!r} (from the command line).{_closest(key, schema)} "
                    f"To add a key on purpose, write +{key}=..."
                )
        value = _coerce(key, value, schema.get(key), "the command line")
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)

    for key, default in schema.items():  # type checks on every source's values
        current = OmegaConf.select(cfg, key, throw_on_missing=False)
        if not isinstance(current, (DictConfig,)):
            coerced = _coerce(key, _plain(current), default, "the config")
            if coerced is not current and not isinstance(coerced, list):
                OmegaConf.update(cfg, key, coerced, merge=False)
    OmegaConf.resolve(cfg)
    return cfg


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig,)) or OmegaConf.is_list(value) else value


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


_MOVED = ("load_config", "resolve", "validate", "world_size", "uses_reference", "check_batch_sizes", "CHOICES",
          "LOGGERS")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        raise ImportError(f"agentgym.config.{name} moved to agentgym.trainer.config "
                          f"(from agentgym.trainer.config import {name})")
    raise AttributeError(f"module 'agentgym.config' has no attribute {name!r}")
