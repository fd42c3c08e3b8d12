"""The training config: ``agentgym.config``'s composed YAML, with the trainer's meaning.

``load_config`` composes (``agentgym.config.compose_config``: files, groups, overrides, key and
type checks), then ``resolve`` fills the ``null`` defaults that follow from other keys (critic
on for ``gae``, critic batch sizes from the actor's, ...) and ``validate`` rejects values outside
their choices (algorithm names come from the registries in ``agentgym.trainer.algos``) and batch
sizes that cannot divide, before any work starts.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError, compose_config
from agentgym.trainer import algos

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


def load_config(
    env: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
    config_name: str | None = None,
) -> DictConfig:
    """Compose, override, resolve and validate a training config (see ``agentgym.config``);
    ``config_name``: a named top-level config such as ``async_ppo_trainer``."""
    cfg = compose_config(env, config_file, overrides, directory, config_name)
    resolve(cfg)
    validate(cfg)
    return cfg


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
    from agentgym.trainer.async_config import validate_async

    validate_async(cfg)
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
