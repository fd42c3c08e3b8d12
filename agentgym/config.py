"""Training configuration: YAML files under ``configs/`` plus dotted ``a.b=c`` overrides.

Where the files live (one source of truth): the top-level ``configs/`` directory of the
repository, which the wheel also carries as ``agentgym/configs`` (``setup.py`` copies it in).
It is found, in order, at ``$AGENTGYM_CONFIG_DIR``, inside the installed package (a wheel),
beside the package (``<repo>/configs``: a checkout or an editable install), then at
``./configs`` in the working directory; ``config_dir()`` says where it looked when it finds
none.

How a config is made (``compose``), later steps winning:

1. The schema, ``agentgym.config_schema.TrainConfig`` (``configs/train.yaml`` is written from it):
   every key a run may set, with its type, default and help. Its ``GroupDefaults`` pick one file per
   group: ``algorithm``, ``model``, ``server``, ``env``. (``sft``, ``generation``, ``evaluation``: their own
   schemas, ``SFTConfig``, ``GenerationConfig``, ``EvaluationConfig``, without groups.)
2. The chosen group files, ``configs/<group>/<choice>.yaml``, merged at the top level.
   ``--env NAME`` picks ``configs/env/NAME.yaml`` when it exists, else ``env/generic.yaml``
   with ``env.name=NAME``. A bare ``group=choice`` on the command line picks another file
   (``algorithm=ppo``). An env file may carry its own ``defaults`` mapping: the groups it
   names are its choice unless the user picked them (``--env sokoban`` picks GRPO, ``--env
   sokoban algorithm=ppo`` still runs PPO). Then ``configs/env/<env>/<model>.yaml``, where it
   exists: the env preset's settings for that model (``model_specialization``).
3. A named top-level config, ``configs/<config_name>.yaml`` (``agentgym train --config-name
   async_ppo_trainer``; ``--async`` picks that one): a file beside ``train.yaml`` that sets other
   defaults for some of its keys (and may carry its own ``defaults`` mapping of group choices).
   Its values may interpolate others (``${async_training.use_rollout_log_probs}``): they are
   resolved after the overrides, so an override of the source reaches the copy.
4. ``--config FILE``: a user's YAML (it may carry its own ``defaults`` mapping).
5. Command-line overrides: ``data.train_batch_size=8``, values parsed as YAML
   (``trainer.logger=[console,tensorboard]``); ``+a.b=c`` (or ``++a.b=c``) adds a key train.yaml lacks
   (nothing in agentgym reads it: ``Composition.added`` lists them so the caller can say so; another
   system's key the key policy knows is treated as without the ``+``); Hydra's ``~a.b`` takes a key out
   again: it gets the value it had before ``--config FILE`` (train.yaml's and the groups').
   ``hydra_config_file`` turns Hydra's ``--config-path DIR --config-name NAME`` into the file to load.

Every key must be one the schema has (every typo is reported at once, each with the closest valid key
named) and every value of its field's type, one of its choices where the field is a ``Literal``
(``agentgym.config_schema.values``); the result is a structured config of the schema, so values keep
their types. A ``key_policy`` may accept a key the schema lacks (another system's key with no effect
here: dropped and listed in ``Composition.ignored``) or refuse it with a reason; a ``value_policy``
translates another system's spelling of a value first. ``Composition.origins`` says where each value
came from (``agentgym config --show``). What values mean together (derived defaults, batch sizes that
must divide) is the trainer's: ``agentgym.trainer.config.load_config``.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from agentgym.config_schema import SCHEMAS, ConfigError, base_defaults, leaves, schema_of
from agentgym.config_schema.keys import KeyPolicy, KeyReport, check_keys, flatten, is_open
from agentgym.config_schema.values import check_value, structured

GROUPS = ("algorithm", "model", "server", "env")
BASE_CONFIGS = tuple(SCHEMAS)  # configs/<name>.yaml written from a schema; any other top-level file is a named config
ValuePolicy = Callable[[Callable[[str], Any]], "list[tuple[str, Any, str]]"]
"""``get -> [(key, value, note)]``: values another system spells another way, read with ``get(key)`` from the
composed values and replaced by ``value`` before the type checks (``note`` says why, ``Composition.notes``)."""


@dataclass
class Composition:
    """A composed config and where its keys came from."""

    cfg: DictConfig
    explicit: set[str] = field(default_factory=set)  # leaf keys the user set (--config file, overrides)
    added: dict[str, Any] = field(default_factory=dict)  # +key=value keys train.yaml lacks
    ignored: dict[str, str] = field(default_factory=dict)  # accepted keys with no effect: key -> reason
    groups: dict[str, str] = field(default_factory=dict)  # the group files used
    notes: list[str] = field(default_factory=list)  # values read another system's way (the loader's notes)
    origins: dict[str, str] = field(default_factory=dict)  # leaf key -> where its value came from (unset: default)

    def origin(self, key: str) -> str:
        """Where ``key``'s value came from: its own origin, else the nearest section's, else ``default``."""
        while key:
            if key in self.origins:
                return self.origins[key]
            key = key.rpartition(".")[0]
        return "default"

    def mark(self, data: dict[str, Any], where: str, prefix: str = "") -> None:
        """Record ``where`` as the origin of every leaf of ``data`` (nested at ``prefix``)."""
        for key in flatten(data, prefix):
            if not key:
                continue
            for inner in [k for k in self.origins if k.startswith(key + ".")]:
                del self.origins[inner]
            self.origins[key] = where


# ---- finding and reading files ----------------------------------------------------------


def config_dir() -> Path:
    """The ``configs/`` directory (see the module docstring for the search order)."""
    candidates = []
    if os.environ.get("AGENTGYM_CONFIG_DIR"):
        candidates.append(Path(os.environ["AGENTGYM_CONFIG_DIR"]))
    here = Path(__file__).resolve().parent
    candidates.append(here / "configs")  # an installed wheel's copy (setup.py builds it in)
    candidates.append(here.parent / "configs")  # a checkout, or an editable install
    candidates.append(Path.cwd() / "configs")
    for candidate in candidates:
        if (candidate / "train.yaml").is_file():
            return candidate
    raise ConfigError(
        "could not find agentgym's configs/ directory (looked in: "
        + ", ".join(str(c) for c in candidates)
        + "). Reinstall agentgym from its wheel or a checkout (`pip install .`), or set AGENTGYM_CONFIG_DIR to "
        "a copy of the repository's configs/."
    )


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_CACHE: dict[tuple[str, int, int], dict[str, Any]] = {}


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping (a fresh copy; parsed once per file version)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _YAML_CACHE:
        try:
            data = yaml.load(path.read_text(), Loader=_LOADER) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping at the top level, not {type(data).__name__}")
        _YAML_CACHE[key] = data
    return copy.deepcopy(_YAML_CACHE[key])


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` merged into a copy of ``base``: mappings recursively, anything else replaced."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and value:
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


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
    return number_or_value(value)


def number_or_value(value: Any) -> Any:
    """``"2e-6"`` (YAML 1.1 reads an exponent without a dot as text) -> ``2e-06``; anything else as is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def parse_override(item: str) -> tuple[str, Any, bool]:
    """``"+a.b=c"`` -> ``("a.b", "c", True)``: key, parsed value, whether it may add a new key (Hydra's
    ``+key=`` and ``++key=``)."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key.lstrip("+"):
        hint = " (Hydra's ~key removes a key: write it without =)" if key.startswith("~") else ""
        raise ConfigError(f"an override looks like key=value (e.g. data.train_batch_size=8), got {item!r}{hint}")
    add = key.startswith("+")
    return key.lstrip("+"), parse_value(value), add


def is_removal(item: str) -> bool:
    """Hydra's ``~key`` (or ``~key=value``): take ``key`` out of the config."""
    return item.strip().startswith("~")


def hydra_config_file(config_path: str | None, config_name: str | None) -> Path:
    """Hydra's ``--config-path DIR --config-name NAME``: the file ``DIR/NAME.yaml`` (``DIR`` relative to the
    working directory, as a launch script run from its repository's root sees it)."""
    if not config_name:
        raise ConfigError("--config-path names a directory; give the file in it with --config-name NAME")
    directory = Path(os.path.expanduser(config_path or "."))
    name = config_name if config_name.endswith((".yaml", ".yml")) else f"{config_name}.yaml"
    path = directory / name
    if not path.is_file():
        here = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        close = difflib.get_close_matches(Path(name).stem, here, n=1)
        hint = f" Did you mean --config-name {close[0]}?" if close else ""
        where = (
            f"{directory} holds: {', '.join(here[:12])}" if here else f"{directory} is not a directory with YAML files"
        )
        raise ConfigError(
            f"no config {path} (--config-path {config_path} --config-name {config_name}; the path is "
            f"relative to the working directory {Path.cwd()}).{hint} {where}"
        )
    return path


# ---- composing -----------------------------------------------------------------------------


def compose(
    env: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
    *,
    env_group: str | None = None,
    key_policy: KeyPolicy | None = None,
    value_policy: ValuePolicy | None = None,
    base_file: str = "train.yaml",
    config_name: str | None = None,
) -> Composition:
    """Compose the base config (``train.yaml``: the schema ``agentgym.config_schema.TrainConfig``), its group
    files, ``config_file`` and ``overrides`` (see the module docstring); ``env_group`` picks an env group file
    without naming an env (``--agent`` runs); ``base_file``: another base config in ``configs/``
    (``sft.yaml``, ``generation.yaml``, ``evaluation.yaml``: each with its schema in ``config_schema.SCHEMAS``);
    ``config_name``: a named config overlaying it (``async_ppo_trainer``, see ``named_config``);
    ``value_policy``: values another system spells another way, replaced before the type checks. Every unknown
    key of every source is reported in one ``ConfigError``. The result is a structured DictConfig of the
    schema: every value of its field's type."""
    base_dir = Path(directory) if directory is not None else config_dir()
    base_name = Path(base_file).stem
    schema_cls = schema_of(base_name) if base_file.endswith(".yaml") else None
    if schema_cls is None:
        raise ConfigError(f"no base config {base_file!r}; base configs: {', '.join(f'{b}.yaml' for b in BASE_CONFIGS)}")
    base = base_defaults(base_name) or {}
    choices: dict[str, str | None] = dict(base.pop("defaults", {}) or {})
    schema = flatten(base)
    fields = leaves(schema_cls)
    report = KeyReport(schema, key_policy)
    user_choices: set[str] = set()
    composition = Composition(OmegaConf.create())

    named = named_config(base_dir, config_name, base_file, schema) if config_name else {}
    choices.update(named.pop("defaults", {}) or {})

    user: dict[str, Any] = {}
    if config_file is not None:
        user = read_yaml(Path(config_file))
        file_defaults = user.pop("defaults", {}) or {}
        if not isinstance(file_defaults, dict):
            raise ConfigError(
                f"{config_file}: 'defaults' must map a group to a file name (e.g. algorithm: ppo); "
                "agentgym composes no Hydra defaults list (translate the file with `agentgym config "
                "--from`)"
            )
        choices.update(file_defaults)
        user_choices.update(file_defaults)
        user = report.check_mapping(user, str(config_file))

    env_name_override: str | None = None
    if env is not None:
        if (base_dir / "env" / f"{env}.yaml").is_file():
            choices["env"] = env
        else:
            choices["env"] = "generic"
            env_name_override = env
    elif env_group is not None:
        choices["env"] = env_group

    dotted: list[tuple[str, Any, bool]] = []
    removed: list[str] = []
    for item in overrides:
        if is_removal(item):
            removed.append(item.strip().lstrip("~").partition("=")[0].strip())
            continue
        key, value, add = parse_override(item)
        if key in GROUPS and not add:
            if key == "env" and not (base_dir / "env" / f"{value}.yaml").is_file():
                choices["env"], env_name_override = "generic", str(value)
            else:
                choices[key] = str(value)
            user_choices.add(key)
            continue
        dotted.append((key, value, add))

    env_data: dict[str, Any] = {}
    if choices.get("env") is not None:
        env_path = _group_file(base_dir, "env", str(choices["env"]))
        env_data = read_yaml(env_path)
        for group, choice in (env_data.pop("defaults", {}) or {}).items():  # the env preset's own picks
            if group not in user_choices:
                choices[group] = choice

    merged = base
    used: dict[str, str] = {}
    for group in GROUPS:
        if choices.get(group) is None:
            continue
        path = _group_file(base_dir, group, str(choices[group]))
        data = env_data if group == "env" else read_yaml(path)
        check_keys(data, schema, str(path))
        merged = deep_merge(merged, data)
        composition.mark(data, f"group file {group}/{choices[group]}.yaml")
        used[group] = str(choices[group])
    special = model_specialization(base_dir, choices)
    if special is not None:  # the env preset's settings for the chosen model win over both files
        data = read_yaml(special)
        check_keys(data, schema, str(special))
        merged = deep_merge(merged, data)
        used["env/model"] = f"{choices['env']}/{choices['model']}"
        composition.mark(data, f"group file env/{used['env/model']}.yaml")
    if env_name_override is not None:
        merged = deep_merge(merged, {"env": {"name": env_name_override}})
        composition.mark({"env": {"name": env_name_override}}, f"--env {env_name_override}")
    if named:
        merged = deep_merge(merged, named)
        composition.mark(named, f"named config {config_name}")
    before_user = copy.deepcopy(merged)
    origins_before_user = dict(composition.origins)
    if user:
        merged = deep_merge(merged, user)
        composition.mark(user, f"--config {config_file}")
    cfg = OmegaConf.create(merged)

    explicit = set(flatten(user))
    for key in removed:  # Hydra's ~key: the value the file did not set (train.yaml's and the groups')
        if key not in schema and not is_open(key) and key not in report.prefixes:
            report.ignored[key] = "removed with ~ (not a key agentgym has)"
            continue
        OmegaConf.update(cfg, key, copy.deepcopy(lookup(before_user, key)), merge=False, force_add=True)
        explicit.difference_update({k for k in explicit if k == key or k.startswith(key + ".")})
        for inner in [k for k in composition.origins if k == key or k.startswith(key + ".")]:
            del composition.origins[inner]
        composition.origins.update(
            {k: v for k, v in origins_before_user.items() if k == key or k.startswith(key + ".")}
        )
    dotted = [d for d in dotted if not any(d[0] == r or d[0].startswith(r + ".") for r in removed)]
    added: dict[str, Any] = {}
    for key, value, add in dotted:
        if key not in schema and not is_open(key) and key not in report.prefixes:
            verdict = report.policy(key, value) if report.policy is not None else None
            if add and verdict is None:  # Hydra's +key=: a key nobody defines, kept and listed
                added[key] = value
            else:
                target = report.check(key, value, "the command line", add_hint=not add)
                if target is None:
                    continue
                key = target
        leaf = fields.get(key)
        if key not in added and (leaf is None or (value is not None and leaf.kind != "choice")):
            # choices and nulls are checked below, once another system's spellings are translated
            value = check_value(key, value, "the command line", leaf, schema.get(key), is_open(key))
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
        explicit.update(flatten(value, key) if isinstance(value, dict) else {key: value})
        composition.mark(value, "command line", key)
    report.raise_errors()

    if value_policy is not None:
        for key, value, note in value_policy(lambda k: OmegaConf.select(cfg, k)):
            OmegaConf.update(cfg, key, value, merge=False)
            composition.notes.append(note)
            composition.origins[key] = "derived (another system's value)"
    for key, default in schema.items():  # type checks on every source's values
        current = OmegaConf.select(cfg, key, throw_on_missing=False)
        if not isinstance(current, (DictConfig,)):
            where = composition.origin(key)
            where = {"command line": "the command line", "default": "the config"}.get(where, where)
            coerced = check_value(key, _plain(current), where, fields.get(key), default, is_open(key))
            if coerced is not current:
                OmegaConf.update(cfg, key, coerced, merge=False)
    OmegaConf.resolve(cfg)
    cfg = structured(schema_cls, cfg, added)
    composition.cfg = cfg
    composition.explicit = explicit
    composition.added = added
    composition.ignored = report.ignored
    composition.groups = used
    return composition


def model_specialization(base_dir: Path, choices: dict[str, str | None]) -> Path | None:
    """``configs/env/<env>/<model>.yaml``, where it exists: an env preset's settings for one model
    (Hydra's config specialization). ``--env arithmetic model=smollm2-135m`` merges
    ``configs/env/arithmetic/smollm2-135m.yaml`` after both group files, so the model's prompt, lengths
    and learning rate replace the ones the env preset chose for its default model."""
    env, model = choices.get("env"), choices.get("model")
    if env is None or model is None:
        return None
    path = base_dir / "env" / str(env) / f"{model}.yaml"
    return path if path.is_file() else None


def named_configs(directory: Path | None = None) -> list[str]:
    """The named configs one may pick (``configs/*.yaml`` other than the base schemas)."""
    return sorted(p.stem for p in (directory or config_dir()).glob("*.yaml") if p.stem not in BASE_CONFIGS)


def named_config(base_dir: Path, name: str, base_file: str, schema: dict[str, Any]) -> dict[str, Any]:
    """``configs/<name>.yaml``, a named config overlaying the base file: its keys must be the base's."""
    path = base_dir / f"{name}.yaml"
    if f"{name}.yaml" == base_file:
        return {}
    if not path.is_file() or name in BASE_CONFIGS:
        known = named_configs(base_dir)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"no config named {name!r} ({path} is not one).{hint} Named configs: {', '.join(known)}")
    data = read_yaml(path)
    check_keys({k: v for k, v in data.items() if k != "defaults"}, schema, str(path))
    return data


def lookup(data: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``data["a"]["b"]`` for ``"a.b"`` in nested plain dicts; ``default`` where a part is missing."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig,)) or OmegaConf.is_list(value) else value


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)
