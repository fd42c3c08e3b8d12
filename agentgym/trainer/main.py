"""``agentgym train``: build the config, the rollout side and the trainer, run, summarise.

    agentgym train --env sokoban
    agentgym train --env sokoban data.train_batch_size=8 algorithm=ppo trainer.logger=[console,tensorboard]

From Python, ``train(cfg, source=...)`` runs the same loop on any ``TrajectorySource``
(``agentgym.trainer.sources``): this is where the gateway plugs in its agent trajectories.
``actor_rollout_ref.hybrid_engine=false`` (``agentgym train --async``) runs the asynchronous
trainer (``agentgym.trainer.async_trainer``); ``actor_rollout_ref.rollout.agent`` picks the agent
flow that produces the trajectories (``agentgym.trainer.agent_flows``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from omegaconf import DictConfig

from agentgym.config import ConfigError
from agentgym.trainer.config import load_config, world_size


def describe(cfg: DictConfig) -> str:
    a = cfg.actor_rollout_ref
    steps = cfg.trainer.total_training_steps
    return (
        f"agentgym train: env {cfg.env.name} | model {a.model.path} | {cfg.algorithm.adv_estimator}"
        f"{' + critic' if cfg.critic.enable else ''} | {cfg.data.train_batch_size} tasks x {a.rollout.n} "
        f"per step | {steps if steps is not None else str(cfg.trainer.total_epochs) + ' epoch(s)'} steps | "
        f"{world_size(cfg)} worker(s){' on Ray' if cfg.trainer.use_ray else ' in-process'} | "
        f"{a.rollout.name} server(s) | run dir {cfg.trainer.default_local_dir}" + _describe_async(cfg)
    )


def _describe_async(cfg: DictConfig) -> str:
    if cfg.actor_rollout_ref.hybrid_engine:
        return ""
    from agentgym.trainer.async_config import AsyncSettings

    s = AsyncSettings.from_cfg(cfg)
    plan = s.plan(int(cfg.data.train_batch_size), None)
    return (f"\n  asynchronous: push every {s.trigger_parameter_sync_step} update(s), staleness_threshold "
            f"{s.staleness_threshold:g} -> at most {plan.budget} tasks beyond those trained, version lag <= "
            f"{plan.max_lag}; partial_rollout {str(s.partial_rollout).lower()}; rollout pool "
            f"{s.rollout_nnodes}x{s.rollout_n_gpus_per_node}")


def train(cfg: DictConfig, source: Any = None, servers: Any = None, show_progress: bool = True) -> dict[str, Any]:
    """Run a training config to the end; returns the trainer's summary.

    ``source``: a ``TrajectorySource`` (default: ``EnvRolloutSource`` over ``env.name``).
    ``servers``: a ``RolloutServers`` (default: started from ``actor_rollout_ref.rollout``);
    pass ``servers=False`` with a source that needs no policy servers (no weight sync).
    """
    from agentgym.trainer.async_config import is_async
    from agentgym.trainer.ppo_trainer import PPOTrainer

    started_ray = False
    if cfg.trainer.use_ray:
        import ray

        started_ray = not ray.is_initialized()
    if servers is None:
        servers = rollout_servers(cfg)
    elif servers is False:
        servers = None
    trainer = None
    try:
        if source is None:
            source = flow_source(cfg, servers)
        if is_async(cfg):
            from agentgym.trainer.async_trainer import AsyncPPOTrainer

            trainer = AsyncPPOTrainer(cfg, source, servers, show_progress=show_progress)
        else:
            trainer = PPOTrainer(cfg, source, servers, show_progress=show_progress)
        return trainer.fit()
    finally:
        if trainer is not None:
            trainer.shutdown()
        elif servers is not None:
            servers.stop()
        if started_ray:
            import ray

            ray.shutdown()


def rollout_servers(cfg: DictConfig) -> Any:
    """The policy servers: on the rollout pool's nodes (Ray, asynchronous trainer), else started here."""
    from agentgym.trainer.async_config import is_async

    if is_async(cfg) and cfg.trainer.use_ray and not cfg.actor_rollout_ref.rollout.server_urls:
        from agentgym.trainer.resource_pools import RayRolloutServers

        return RayRolloutServers(cfg)
    from agentgym.trainer.weight_sync import RolloutServers

    return RolloutServers(cfg)


def flow_source(cfg: DictConfig, servers: Any, agent: Any = None) -> Any:
    """The trajectory source of the agent flow the config (or ``--agent``) names."""
    from agentgym.trainer.agent_flows import resolve_agent_flow

    flow = resolve_agent_flow(cfg, agent)
    if flow is not None:
        return _agent_source(cfg, flow, servers)
    if not cfg.env.name:
        raise ConfigError("no env to train on: pass --env NAME (see `agentgym envs`) or set env.name")
    from agentgym.model import load_tokenizer
    from agentgym.trainer.sources import EnvRolloutSource

    return EnvRolloutSource(cfg, servers.client, load_tokenizer(str(cfg.actor_rollout_ref.model.path)))


def _check_env(name: str) -> None:
    from agentgym.registry import env_spec

    try:
        env_spec(name)
    except KeyError as exc:
        raise ConfigError(str(exc)) from None


def _agent_source(cfg: DictConfig, agent: Any, servers: Any) -> Any:
    """The gateway's trajectory source for ``--agent module:function``."""
    from agentgym.gateway.agent_source import trajectory_source

    return trajectory_source(cfg, agent, servers)


class ProgressSafeHandler(logging.Handler):
    """Writes log records to stderr above the progress bar (``tqdm.write``) instead of into it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(f"agentgym train: {record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)
        except Exception:
            self.handleError(record)


def show_trainer_warnings() -> logging.Handler | None:
    """Make the trainer's warnings readable on the command line: ``agentgym train: warning: ...``
    on stderr, above the progress bar. Left alone when the program has set up logging itself
    (the trainer's or the root logger has handlers). Returns the handler added, if any."""
    logger = logging.getLogger("agentgym.trainer")
    if logger.handlers or logging.getLogger().handlers:
        return None
    handler = ProgressSafeHandler(logging.WARNING)
    logger.addHandler(handler)
    return handler


def summary_text(summary: dict[str, Any]) -> str:
    metrics = summary.get("metrics") or {}
    val = summary.get("val_metrics") or {}
    lines = [f"done: {summary['steps']} steps in {summary['seconds']:.0f} s"]
    run, flat = summary.get("steps_run", 0), summary.get("flat_reward_steps", 0)
    if run and flat == run:
        lines[0] += (f", but the policy learned nothing: every group got identical rewards at every step "
                     f"({flat} of {run}), so all advantages were zero (see the warning above)")
    keys = ("reward/mean", "outcome_reward/mean", "success_rate", "response_length/mean", "turns/mean",
            "actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing_s/step", "weight_sync/save_s",
            "weight_sync/load_s")
    shown = [f"{k} {metrics[k]:.4g}" for k in keys if k in metrics]
    if shown:
        lines.append("  last step: " + " | ".join(shown))
    vshown = [f"{k} {val[k]:.4g}" for k in ("val/reward/mean", "val/success_rate", "val/turns/mean") if k in val]
    if vshown:
        lines.append("  validation: " + " | ".join(vshown))
    lines.append(f"  run dir:     {summary['run_dir']}")
    if summary.get("checkpoint"):
        lines.append(f"  checkpoint:  {summary['checkpoint']} (resume: run the same command again)")
    if summary.get("hf_model"):
        lines.append(f"  final model: {summary['hf_model']} (agentgym serve --model {summary['hf_model']})")
    if summary.get("curves"):
        lines.append(f"  curves:      {summary['curves']} (agentgym plot {summary['run_dir']})")
    if summary.get("lag_histogram"):
        histogram = ", ".join(f"{lag}: {count}" for lag, count in summary["lag_histogram"].items())
        lines.append(f"  version lag: {histogram} (trajectories trained at each lag)")
    if summary.get("metrics_file"):
        lines.append(f"  metrics:     {summary['metrics_file']}")
    if summary.get("tensorboard"):
        lines.append(f"  tensorboard: tensorboard --logdir {summary['tensorboard']}")
    lines.append(f"  samples:     {summary['samples_file']}")
    return "\n".join(lines)


def train_command(args: argparse.Namespace) -> int:
    """The ``agentgym train`` subcommand."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from agentgym.trainer.workers import quiet_transformers

    quiet_transformers()  # no per-load progress bars between our own progress lines
    env = getattr(args, "env", None)
    agent = getattr(args, "agent", None)
    try:
        config_name = getattr(args, "config_name", None) or ("async_ppo_trainer" if getattr(args, "async_", False)
                                                              else None)
        cfg = load_config(env=env, config_file=getattr(args, "config", None), overrides=list(args.overrides or ()),
                          config_name=config_name)
        for key in ("train_files", "val_files"):
            value = cfg.data[key]
            if isinstance(value, str) and "://" not in value and not os.path.exists(value):
                raise ConfigError(f"data.{key}={value} does not exist; pass data.{key}=PATH (a .jsonl/.parquet "
                                  f"file or a directory holding train/test files)")
        from agentgym.trainer.agent_flows import resolve_agent_flow

        if agent is None:
            agent = resolve_agent_flow(cfg)
        if agent is None:
            if not cfg.env.name:
                raise ConfigError("no env to train on: pass --env NAME (see `agentgym envs`) or --agent MODULE:FUNCTION")
            _check_env(str(cfg.env.name))
    except ConfigError as exc:
        print(f"agentgym train: {exc}", file=sys.stderr)
        return 2
    print(describe(cfg), flush=True)
    source = None
    servers = None
    if agent is not None:
        servers = rollout_servers(cfg)
        try:
            source = _agent_source(cfg, agent, servers)
        except BaseException:
            servers.stop()
            raise
    handler = show_trainer_warnings()
    try:
        summary = train(cfg, source=source, servers=servers)
    finally:
        if handler is not None:
            logging.getLogger("agentgym.trainer").removeHandler(handler)
    print(summary_text(summary), flush=True)
    return 0
