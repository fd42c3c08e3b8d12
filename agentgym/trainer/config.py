"""The training config: ``agentgym.config``'s composed ``TrainConfig``, with the trainer's meaning.

``load_config`` composes (``agentgym.config.compose``: the schema ``agentgym.config_schema.TrainConfig``,
files, groups, overrides, key, type and choice checks, with veRL's keys and spellings understood through
``agentgym.compat.verl``), then ``resolve`` fills the ``null`` defaults that follow from other keys (critic
on for ``gae``, critic batch sizes from the actor's, the run's name, ...) and ``validate`` rejects values
outside their choices (algorithm names come from the registries in ``agentgym.trainer.algos``) and batch
sizes that cannot divide, before any work starts. Keys that have no effect under the chosen settings are
warned about once (``config_notes``). The result is a structured config: every key present, every value
of its field's type.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.compat.verl import VERL_LEFT_NULL, verl_key_policy, verl_values
from agentgym.config import Composition, ConfigError, compose, flatten
from agentgym.config_schema import TrainConfig, choice_error, choices, leaves
from agentgym.trainer import algos

log = logging.getLogger("agentgym.config")

CHOICES = choices(TrainConfig)
"""Key -> the values it may take (the schema's ``Literal`` fields; checked as the config is composed)."""
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


def load_config(
    env: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
    *,
    agent: str | None = None,
    warn: bool = True,
    config_name: str | None = None,
) -> DictConfig:
    """Compose, override, resolve and validate a training config (see ``agentgym.config``).

    ``agent``: the ``--agent MODULE:FUNCTION`` of the run (composes ``configs/env/agent.yaml``
    unless ``env`` is given, and names the run). ``warn``: log the keys that have no effect
    (``config_notes``) on the ``agentgym.config`` logger. ``config_name``: a named config over
    ``train.yaml`` (``async_ppo_trainer``)."""
    composition = compose_training(env, config_file, overrides, directory, agent=agent, config_name=config_name)
    if warn:
        for note in config_notes(composition):
            log.warning("%s", note)
    return composition.cfg


def compose_training(
    env: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
    *,
    agent: str | None = None,
    config_name: str | None = None,
) -> Composition:
    """``load_config`` without the warnings: the composition (which keys the user set) resolved and validated."""
    composition = compose(
        env,
        config_file,
        overrides,
        directory,
        env_group="agent" if agent and env is None else None,
        key_policy=verl_key_policy,
        value_policy=verl_value_policy,
        config_name=config_name,
    )
    before = flatten(composition.cfg)
    resolve(composition.cfg, agent=agent)
    for key, value in flatten(composition.cfg).items():
        if before.get(key, value) != value:
            composition.origins[key] = "derived by load_config"
    validate(composition.cfg)
    return composition


MEMORY_ONLY = "a micro-batch size trades memory for speed; the trained result is the same"


def verl_value_policy(get: Callable[[str], Any]) -> list[tuple[str, Any, str]]:
    """veRL's spellings of agentgym values, and the sizes veRL's dumped configs leave null, with their notes
    (``compose``'s ``value_policy``)."""
    out = [(key, ours, f"{key}={theirs}: {why} ({key}={ours})") for key, theirs, ours, why in verl_values(get)]
    for key in VERL_LEFT_NULL:
        if get(key) is None:
            default = leaves(TrainConfig)[key].default
            note = (
                f"{key}=null (veRL leaves it for the launch script to set): agentgym's default "
                f"{default} ({MEMORY_ONLY})"
            )
            out.append((key, default, note))
    return out


def agent_label(agent: str) -> str:
    """``examples.gsm8k_agent:run`` -> ``gsm8k_agent`` (the run's name for an ``--agent`` run)."""
    module, _, function = agent.partition(":")
    label = module.rsplit(".", 1)[-1] or function
    return label if function in ("run", "main", "") else f"{label}.{function}"


def resolve(cfg: DictConfig, agent: str | None = None) -> DictConfig:
    """Fill the ``null`` defaults that follow from other keys (in place)."""
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    critic = cfg.critic
    if actor.ppo_mini_batch_size is None:
        actor.ppo_mini_batch_size = cfg.data.train_batch_size
    if actor.strategy == "fsdp":  # veRL's FSDP: FSDP2 on GPUs, plain data parallel on CPU
        actor.strategy = "auto"
    if critic.enable is None:
        critic.enable = cfg.algorithm.adv_estimator == "gae"
    if critic.model.path is None:
        critic.model.path = cfg.actor_rollout_ref.model.path
    for key in (
        "ppo_mini_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "ppo_epochs",
        "loss_agg_mode",
        "use_dynamic_bsz",
    ):
        if critic[key] is None:
            critic[key] = actor[key]
    for optim in (actor.optim, critic.optim):
        if optim.lr_scheduler_type is not None:
            optim.warmup_style = optim.lr_scheduler_type
    if rollout.log_prob_micro_batch_size_per_gpu is None:
        rollout.log_prob_micro_batch_size_per_gpu = 16
    for section in (actor, cfg.actor_rollout_ref.ref):
        if section.log_prob_micro_batch_size_per_gpu is None:
            section.log_prob_micro_batch_size_per_gpu = rollout.log_prob_micro_batch_size_per_gpu
    if not rollout.do_sample:  # veRL: do_sample=false is greedy decoding
        rollout.temperature = 0.0
    if not rollout.val_kwargs.do_sample:
        rollout.val_kwargs.temperature = 0.0
    turns = rollout.multi_turn
    if turns.max_user_turns is not None:  # veRL: after max_user_turns replies to the model, its next turn is the last
        cap = int(turns.max_user_turns) + 1
        turns.max_assistant_turns = min(cap, int(turns.max_assistant_turns)) if turns.max_assistant_turns else cap
    if rollout.max_tokens_per_turn is None:
        rollout.max_tokens_per_turn = cfg.data.max_response_length
    for section in (actor, critic):
        if section.checkpoint.load_contents is None:
            section.checkpoint.load_contents = list(section.checkpoint.save_contents)
    if cfg.data.val_batch_size is None and (not cfg.data.val_files or cfg.env.tags):
        cfg.data.val_batch_size = cfg.env.num_val_tasks  # with val_files: every row, set by preflight (veRL)
    if isinstance(cfg.trainer.logger, str):
        cfg.trainer.logger = [cfg.trainer.logger]
    trainer = cfg.trainer
    if trainer.experiment_name is None:
        who = cfg.env.name or (agent_label(agent) if agent else None) or "run"
        trainer.experiment_name = f"{who}-{cfg.algorithm.adv_estimator}"
    if trainer.default_local_dir is None:
        trainer.default_local_dir = f"outputs/{trainer.project_name}/{trainer.experiment_name}"
    return cfg


def world_size(cfg: DictConfig) -> int:
    """Data-parallel workers: ``trainer.nnodes * trainer.n_gpus_per_node``."""
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def uses_reference(cfg: DictConfig) -> bool:
    """The reference policy is loaded only when a KL term needs it."""
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


_choice_error = choice_error


def check_kl_estimator(key: str, value: str) -> None:
    """A KL estimator name (``algorithm.kl_penalty``, ``actor.kl_loss_type``), refused here rather
    than at the first update."""
    base = value[:-1] if value.endswith("+") else value
    if base == "full":
        raise ConfigError(
            f"{key}={value!r}: the exact KL needs every vocabulary token's log-prob, which the "
            f"trainer does not keep (veRL does not implement it either); use low_var_kl (k3), kl (k1) "
            f"or mse (k2)"
        )
    if base not in algos.KL_PENALTY_TYPES:
        raise _choice_error(key, value, [k for k in algos.KL_PENALTY_TYPES if k != "full"])


def validate(cfg: DictConfig) -> None:
    """Choices, names and batch sizes; raises ``ConfigError`` naming the numbers that conflict."""
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise _choice_error(key, value, allowed)
    for name in cfg.trainer.logger:
        if name not in LOGGERS:
            close = difflib.get_close_matches(str(name), LOGGERS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"trainer.logger has {name!r}, not one of {', '.join(LOGGERS)}.{hint}")
    check_kv_cache_size("actor_rollout_ref.rollout", cfg.actor_rollout_ref.rollout)
    check_kl_estimator("algorithm.kl_penalty", str(cfg.algorithm.kl_penalty))
    check_kl_estimator("actor_rollout_ref.actor.kl_loss_type", str(cfg.actor_rollout_ref.actor.kl_loss_type))
    for section in ("actor_rollout_ref.actor", "critic"):
        for which in ("save_contents", "load_contents"):
            for item in OmegaConf.select(cfg, f"{section}.checkpoint.{which}") or []:
                if item not in CHECKPOINT_CONTENTS:
                    raise _choice_error(f"{section}.checkpoint.{which} item", item, CHECKPOINT_CONTENTS)
    check_reward_sources(cfg)
    if cfg.reward_model.enable and cfg.judge.enable and cfg.judge.combine == "replace":
        raise ConfigError(
            "reward_model.enable=true and judge.enable=true with judge.combine=replace: the judge's "
            "score would replace the reward model's. Use one of the two, or judge.combine=add to sum them"
        )
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_N")
    if not cfg.trainer.use_ray and world_size(cfg) != 1:
        raise ConfigError(
            f"trainer.use_ray=false runs one worker in this process, but trainer.nnodes * "
            f"trainer.n_gpus_per_node = {world_size(cfg)}; set trainer.use_ray=true or use one worker"
        )
    if cfg.trainer.total_training_steps is not None and cfg.trainer.total_training_steps < 1:
        raise ConfigError("trainer.total_training_steps must be at least 1 (or null to count epochs)")
    minutes = cfg.trainer.total_training_minutes
    if minutes is not None:
        if minutes <= 0:
            raise ConfigError("trainer.total_training_minutes must be positive (or null: no time limit)")
        if not cfg.actor_rollout_ref.hybrid_engine:
            raise ConfigError(
                "trainer.total_training_minutes is not implemented for the asynchronous trainer "
                "(actor_rollout_ref.hybrid_engine=false): bound it with trainer.total_training_steps"
            )
    actor = cfg.actor_rollout_ref.actor
    positive = {
        "data.train_batch_size": cfg.data.train_batch_size,
        "actor_rollout_ref.rollout.n": cfg.actor_rollout_ref.rollout.n,
        "actor_rollout_ref.actor.ppo_mini_batch_size": actor.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": actor.ppo_micro_batch_size_per_gpu,
        "actor_rollout_ref.actor.ppo_epochs": actor.ppo_epochs,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": actor.ppo_max_token_len_per_gpu,
        "trainer.n_gpus_per_node": cfg.trainer.n_gpus_per_node,
        "trainer.nnodes": cfg.trainer.nnodes,
    }
    for key, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    check_batch_sizes(
        cfg.data.train_batch_size,
        cfg.actor_rollout_ref.rollout.n,
        actor.ppo_mini_batch_size,
        actor.ppo_micro_batch_size_per_gpu,
        world_size(cfg),
        "actor_rollout_ref.actor",
        actor.use_dynamic_bsz,
    )
    if cfg.critic.enable:
        check_batch_sizes(
            cfg.data.train_batch_size,
            cfg.actor_rollout_ref.rollout.n,
            cfg.critic.ppo_mini_batch_size,
            cfg.critic.ppo_micro_batch_size_per_gpu,
            world_size(cfg),
            "critic",
            cfg.critic.use_dynamic_bsz,
        )
    for key, registry in (
        ("algorithm.adv_estimator", algos.ADV_ESTIMATOR_REGISTRY),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", algos.POLICY_LOSS_REGISTRY),
        ("actor_rollout_ref.actor.loss_agg_mode", algos.LOSS_AGG_MODES),
        ("critic.loss_agg_mode", algos.LOSS_AGG_MODES),
        ("algorithm.gigpo.mode", algos.GIGPO_MODES),
        ("algorithm.gigpo.step_grouping", algos.STEP_GROUPINGS),
        ("algorithm.filter_groups.metric", ("score", "acc")),
    ):
        value = OmegaConf.select(cfg, key)
        if value not in registry:
            raise _choice_error(key, value, sorted(registry))
    from agentgym.trainer.async_config import validate_async

    validate_async(cfg)
    if cfg.critic.enable and cfg.algorithm.adv_estimator != "gae":
        raise ConfigError(
            f"critic.enable=true but algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} uses no values; "
            "set algorithm.adv_estimator=gae (or algorithm=ppo) or critic.enable=null"
        )
    if cfg.algorithm.adv_estimator == "gae" and not cfg.critic.enable:
        raise ConfigError("algorithm.adv_estimator=gae needs the critic: set critic.enable=true (or null)")
    from agentgym.rollout.env_groups import check_env_groups

    check_env_groups(cfg)


def check_kv_cache_size(where: str, rollout: DictConfig) -> None:
    """``kv_cache_memory_bytes`` reads as a size the engine takes (``engine_kv_cache_bytes``), before anything loads."""
    from agentgym.server.launchers import engine_kv_cache_bytes

    try:
        engine_kv_cache_bytes(str(rollout.name), rollout.kv_cache_memory_bytes)
    except ValueError as exc:
        raise ConfigError(f"{where}.kv_cache_memory_bytes={rollout.kv_cache_memory_bytes!r}: {exc}") from None


def check_reward_sources(cfg: DictConfig) -> None:
    """A reward model, a judge or a teacher that is enabled names what it needs (``agentgym.rewards``)."""
    from agentgym.rewards.judge import JudgeSettings
    from agentgym.rewards.reward_model import RewardModelSettings
    from agentgym.rewards.teacher import TeacherSettings

    for settings in (RewardModelSettings, JudgeSettings, TeacherSettings):
        settings.from_cfg(cfg)


def check_batch_sizes(
    train_batch_size: int, n: int, mini: int, micro: int, workers: int, section: str, dynamic: bool = False
) -> None:
    """veRL's batch arithmetic: the step's ``train_batch_size * n`` trajectories split into
    mini-batches of ``ppo_mini_batch_size * n``, each split evenly over the workers, each
    worker's share into micro-batches of ``ppo_micro_batch_size_per_gpu`` (one micro-batch
    when it is at least the share; with ``use_dynamic_bsz`` micro-batches go by token budget)."""
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
    if not dynamic and micro < share and share % micro:  # a micro-batch larger than the share is just the share
        raise ConfigError(
            f"each worker's share of a mini-batch is {section}.ppo_mini_batch_size * rollout.n / workers = "
            f"{mini} * {n} / {workers} = {share} trajectories, not a multiple of "
            f"{section}.ppo_micro_batch_size_per_gpu={micro}"
        )


def config_notes(composition: Composition) -> list[str]:
    """The warnings for a composed config: keys nothing reads, keys with no effect (see ``config_notes.py``)."""
    from agentgym.compat.config_notes import notes

    return notes(composition)
