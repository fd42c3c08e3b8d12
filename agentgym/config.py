"""Training configuration: YAML files under ``configs/`` plus dotted ``a.b=c`` overrides.

Where the files live (one source of truth): the top-level ``configs/`` directory of the
repository. It is found, in order, at ``$AGENTGYM_CONFIG_DIR``, beside the ``agentgym``
package (``<repo>/configs``: a source checkout or an editable install), then at
``./configs`` in the working directory. A wheel install must ship that directory next to
the package or point ``AGENTGYM_CONFIG_DIR`` at a copy; ``config_dir()`` says so when it
finds none.

How a config is made (``load_config``), later steps winning:

1. ``configs/train.yaml``: every key a run may set, with its default. Its ``defaults``
   mapping picks one file per group: ``algorithm``, ``model``, ``server``, ``env``.
2. The chosen group files, ``configs/<group>/<choice>.yaml``, merged at the top level.
   ``--env NAME`` picks ``configs/env/NAME.yaml`` when it exists, else ``env/generic.yaml``
   with ``env.name=NAME``. A bare ``group=choice`` on the command line picks another file
   (``algorithm=ppo``).
3. ``--config FILE``: a user's YAML (it may carry its own ``defaults`` mapping).
4. Command-line overrides: ``data.train_batch_size=8``, values parsed as YAML
   (``trainer.logger=[console,tensorboard]``); ``+a.b=c`` adds a key train.yaml lacks.

Then ``validate`` rejects a key train.yaml does not have (naming the closest valid one), a
value of the wrong type or outside its choices, and batch sizes that cannot divide,
before any work starts. ``resolve`` fills the ``null`` defaults that follow from others
(critic on for ``gae``, critic batch sizes from the actor's, ...).
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
CHOICES = {
    "actor_rollout_ref.rollout.name": ("embedded", "vllm", "sglang"),
    "actor_rollout_ref.actor.strategy": ("auto", "fsdp2", "dp"),
    "actor_rollout_ref.actor.optim.warmup_style": ("constant", "cosine"),
    "critic.optim.warmup_style": ("constant", "cosine"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "env.executor": ("thread", "process", "inline", "openenv", "workers", "ray"),
    "env.worker_executor": ("thread", "inline"),
}
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what to do."""


# ---- finding and reading files ----------------------------------------------------------


def config_dir() -> Path:
    """The ``configs/`` directory (see the module docstring for the search order)."""
    candidates = []
    if os.environ.get("AGENTGYM_CONFIG_DIR"):
        candidates.append(Path(os.environ["AGENTGYM_CONFIG_DIR"]))
    import agentgym

    candidates.append(Path(agentgym.__file__).resolve().parents[1] / "configs")
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


def load_config(
    env: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
) -> DictConfig:
    """Compose, override, validate and resolve a training config (see the module docstring)."""
    base_dir = Path(directory) if directory is not None else config_dir()
    base = _read_yaml(base_dir / "train.yaml")
    choices: dict[str, str] = dict(base.pop("defaults", {}) or {})
    schema = flatten(base)

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
    resolve(cfg)
    validate(cfg)
    return cfg


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig,)) or OmegaConf.is_list(value) else value


def resolve(cfg: DictConfig) -> DictConfig:
    """Fill the ``null`` defaults that follow from other keys (in place)."""
    actor = cfg.actor_rollout_ref.actor
    critic = cfg.critic
    if actor.ppo_mini_batch_size is None:
        actor.ppo_mini_batch_size = cfg.data.train_batch_size
    if critic.enable is None:
        critic.enable = cfg.algorithm.adv_estimator == "gae"
    if critic.model.path is None:
        critic.model.path = cfg.actor_rollout_ref.model.path
    for key in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs", "loss_agg_mode"):
        if critic[key] is None:
            critic[key] = actor[key]
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.max_tokens_per_turn is None:
        rollout.max_tokens_per_turn = cfg.data.max_response_length
    if cfg.data.val_batch_size is None:
        cfg.data.val_batch_size = cfg.env.num_val_tasks
    if isinstance(cfg.trainer.logger, str):
        cfg.trainer.logger = [cfg.trainer.logger]
    return cfg


def world_size(cfg: DictConfig) -> int:
    """Data-parallel workers: ``trainer.nnodes * trainer.n_gpus_per_node``."""
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def uses_reference(cfg: DictConfig) -> bool:
    """The reference policy is loaded only when a KL term needs it."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def validate(cfg: DictConfig) -> None:
    """Choices, names and batch sizes; raises ``ConfigError`` naming the numbers that conflict."""
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}.{hint}")
    for name in cfg.trainer.logger:
        if name not in LOGGERS:
            close = difflib.get_close_matches(str(name), LOGGERS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"trainer.logger has {name!r}, not one of {', '.join(LOGGERS)}.{hint}")
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_N")
    if not cfg.trainer.use_ray and world_size(cfg) != 1:
        raise ConfigError(
            f"trainer.use_ray=false runs one worker in this process, but trainer.nnodes * "
            f"trainer.n_gpus_per_node = {world_size(cfg)}; set trainer.use_ray=true or use one worker"
        )
    if cfg.trainer.total_training_steps is not None and cfg.trainer.total_training_steps < 1:
        raise ConfigError("trainer.total_training_steps must be at least 1 (or null to count epochs)")
    positive = {
        "data.train_batch_size": cfg.data.train_batch_size,
        "actor_rollout_ref.rollout.n": cfg.actor_rollout_ref.rollout.n,
        "actor_rollout_ref.actor.ppo_mini_batch_size": cfg.actor_rollout_ref.actor.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu,
        "actor_rollout_ref.actor.ppo_epochs": cfg.actor_rollout_ref.actor.ppo_epochs,
        "trainer.n_gpus_per_node": cfg.trainer.n_gpus_per_node,
        "trainer.nnodes": cfg.trainer.nnodes,
    }
    for key, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    check_batch_sizes(
        cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n,
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size,
        cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, world_size(cfg), "actor_rollout_ref.actor",
    )
    if cfg.critic.enable:
        check_batch_sizes(
            cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.critic.ppo_mini_batch_size,
            cfg.critic.ppo_micro_batch_size_per_gpu, world_size(cfg), "critic",
        )
    from agentgym.trainer import algos  # the names live with the maths

    for key, registry in (
        ("algorithm.adv_estimator", algos.ADV_ESTIMATOR_REGISTRY),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", algos.POLICY_LOSS_REGISTRY),
        ("actor_rollout_ref.actor.loss_agg_mode", algos.LOSS_AGG_MODES),
    ):
        value = OmegaConf.select(cfg, key)
        if value not in registry:
            close = difflib.get_close_matches(str(value), list(registry), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(sorted(registry))}.{hint}")
    if cfg.critic.enable and cfg.algorithm.adv_estimator != "gae":
        raise ConfigError(
            f"critic.enable=true but algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} uses no values; "
            "set algorithm.adv_estimator=gae (or algorithm=ppo) or critic.enable=null"
        )
    if cfg.algorithm.adv_estimator == "gae" and not cfg.critic.enable:
        raise ConfigError("algorithm.adv_estimator=gae needs the critic: set critic.enable=true (or null)")


def check_batch_sizes(train_batch_size: int, n: int, mini: int, micro: int, workers: int, section: str) -> None:
    """veRL's batch arithmetic: the step's ``train_batch_size * n`` trajectories split into
    mini-batches of ``ppo_mini_batch_size * n``, each split evenly over the workers, each
    worker's share into micro-batches of ``ppo_micro_batch_size_per_gpu`` (one micro-batch
    when it is at least the share)."""
    if mini > train_batch_size:
        raise ConfigError(
            f"{section}.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train_batch_size}; "
            f"a mini-batch is a share of the step's tasks"
        )
    if train_batch_size % mini:
        raise ConfigError(
            f"data.train_batch_size={train_batch_size} is not a multiple of {section}.ppo_mini_batch_size={mini}: "
            f"the step's tasks must split into whole mini-batches (try {section}.ppo_mini_batch_size="
            f"{max(d for d in range(1, mini + 1) if train_batch_size % d == 0)})"
        )
    per_mini = mini * n
    if per_mini % workers:
        raise ConfigError(
            f"a mini-batch of {section}.ppo_mini_batch_size * actor_rollout_ref.rollout.n = {mini} * {n} = "
            f"{per_mini} trajectories does not split evenly over trainer.nnodes * trainer.n_gpus_per_node = "
            f"{workers} workers"
        )
    share = per_mini // workers
    if micro < share and share % micro:  # a micro-batch larger than the share is just the share
        raise ConfigError(
            f"each worker's share of a mini-batch is {section}.ppo_mini_batch_size * rollout.n / workers = "
            f"{mini} * {n} / {workers} = {share} trajectories, not a multiple of "
            f"{section}.ppo_micro_batch_size_per_gpu={micro}"
        )


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)
