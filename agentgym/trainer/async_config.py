"""What the asynchronous trainer's keys mean, and the checks on them (``load_config`` calls
``validate_async``).

``actor_rollout_ref.hybrid_engine`` picks the trainer: ``true`` (``train.yaml``) the synchronous one,
rollout and training taking turns on one pool; ``false`` (``configs/async_ppo_trainer.yaml``,
``agentgym train --async``) the asynchronous one, with ``async_training.*`` and the rollout pool
``rollout.{nnodes, n_gpus_per_node}``. ``train.yaml``'s ``async_training`` defaults are the values at
which the asynchronous trainer is the synchronous one (``staleness_threshold: 0``,
``trigger_parameter_sync_step: 1``, ...); the synchronous trainer refuses any other value rather than
ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from agentgym.config import ConfigError
from agentgym.trainer.staleness import StalenessPlan

# async_training / rollout-pool values under which the synchronous trainer runs (train.yaml's defaults)
SYNC_VALUES = {
    "async_training.staleness_threshold": 0.0,
    "async_training.trigger_parameter_sync_step": 1,
    "async_training.require_batches": 1,
    "async_training.partial_rollout": False,
    "async_training.use_rollout_log_probs": False,
    "async_training.max_queue_size": None,
    "async_training.checkpoint_engine.enable": False,
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 1,
}


@dataclass(frozen=True)
class AsyncSettings:
    """``async_training`` and the rollout pool, read once."""

    staleness_threshold: float
    trigger_parameter_sync_step: int
    require_batches: int
    partial_rollout: bool
    use_rollout_log_probs: bool
    max_queue_size: int | None
    checkpoint_engine: bool
    device_buffer_size_M: int
    rollout_nnodes: int
    rollout_n_gpus_per_node: int

    @classmethod
    def from_cfg(cls, cfg: Any) -> AsyncSettings:
        a = cfg.async_training
        return cls(
            a.staleness_threshold,
            a.trigger_parameter_sync_step,
            a.require_batches,
            a.partial_rollout,
            a.use_rollout_log_probs,
            a.max_queue_size,
            a.checkpoint_engine.enable,
            a.checkpoint_engine.device_buffer_size_M,
            cfg.rollout.nnodes,
            cfg.rollout.n_gpus_per_node,
        )

    def plan(self, batch_tasks: int, total_steps: int | None) -> StalenessPlan:
        return StalenessPlan(
            batch_tasks,
            self.trigger_parameter_sync_step,
            self.staleness_threshold,
            None if total_steps is None else total_steps * batch_tasks,
        )


def is_async(cfg: Any) -> bool:
    return not cfg.actor_rollout_ref.hybrid_engine


def validate_async(cfg: Any) -> None:
    """Raise ``ConfigError`` for an ``async_training`` / rollout-pool / ``rollout_correction`` value
    that cannot run (see the module docstring)."""
    correction = cfg.algorithm.rollout_correction
    if correction.rollout_is is not None and correction.rollout_is not in ("token", "sequence"):
        raise ConfigError(
            f"algorithm.rollout_correction.rollout_is={correction.rollout_is!r} is not one of token, sequence or null"
        )
    if not correction.rollout_is_threshold > 0:
        raise ConfigError("algorithm.rollout_correction.rollout_is_threshold must be > 0")
    if correction.rollout_is is not None and not cfg.actor_rollout_ref.actor.use_rollout_log_probs:
        which = "async_training" if is_async(cfg) else "actor_rollout_ref.actor"
        raise ConfigError(
            f"algorithm.rollout_correction.rollout_is={correction.rollout_is} weighs by the servers' "
            f"logprobs as the behaviour policy's: set {which}.use_rollout_log_probs=true"
        )
    if not is_async(cfg):
        for key, value in SYNC_VALUES.items():
            if OmegaConf.select(cfg, key) != value:
                raise ConfigError(
                    f"{key}={OmegaConf.select(cfg, key)} belongs to the asynchronous trainer: run "
                    f"agentgym train --async (or actor_rollout_ref.hybrid_engine=false), or leave "
                    f"{key} at {value}"
                )
        return
    a = cfg.async_training
    ints = {
        "async_training.trigger_parameter_sync_step": a.trigger_parameter_sync_step,
        "async_training.require_batches": a.require_batches,
        "async_training.checkpoint_engine.device_buffer_size_M": a.checkpoint_engine.device_buffer_size_M,
        "rollout.nnodes": cfg.rollout.nnodes,
        "rollout.n_gpus_per_node": cfg.rollout.n_gpus_per_node,
    }
    for key, value in ints.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    if not isinstance(a.staleness_threshold, (int, float)) or a.staleness_threshold < 0:
        raise ConfigError(f"async_training.staleness_threshold must be a number >= 0, got {a.staleness_threshold!r}")
    b = cfg.data.train_batch_size
    if a.max_queue_size is not None and (
        not isinstance(a.max_queue_size, int) or a.max_queue_size < a.require_batches * b
    ):
        raise ConfigError(
            f"async_training.max_queue_size={a.max_queue_size} must hold the groups the trainer takes at "
            f"once: at least require_batches * data.train_batch_size = {a.require_batches * b} "
            f"(or null)"
        )
    if a.use_rollout_log_probs != cfg.actor_rollout_ref.actor.use_rollout_log_probs:
        raise ConfigError(
            "in the asynchronous trainer actor_rollout_ref.actor.use_rollout_log_probs follows "
            "async_training.use_rollout_log_probs; set that one"
        )
    rollout = cfg.actor_rollout_ref.rollout
    servers = rollout.num_servers * rollout.tensor_model_parallel_size
    slots = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node
    if not rollout.server_urls and servers > slots:
        raise ConfigError(
            f"actor_rollout_ref.rollout.num_servers * tensor_model_parallel_size = {servers} devices do "
            f"not fit the rollout pool rollout.nnodes * rollout.n_gpus_per_node = {slots}"
        )
    if not cfg.trainer.use_ray and cfg.rollout.nnodes != 1:
        raise ConfigError("rollout.nnodes > 1 places servers on other nodes with Ray: set trainer.use_ray=true")
