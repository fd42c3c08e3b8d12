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
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.trainer.config import load_config, world_size


def describe(cfg: DictConfig, steps: int | None = None) -> str:
    """The status line: what runs, how long, where it writes."""
    a = cfg.actor_rollout_ref
    if steps is None:
        steps = cfg.trainer.total_training_steps
    length = (f"{steps} steps" if steps is not None
              else f"{cfg.trainer.total_epochs} epoch(s) of the env's tasks")
    target = cfg.env.name if cfg.env.name else (f"envs {', '.join(cfg.env.tags)}" if cfg.env.tags else "an agent")
    return (
        f"agentgym train: {target} | model {a.model.path} | {cfg.algorithm.adv_estimator}"
        f"{' + critic' if cfg.critic.enable else ''} | {cfg.data.train_batch_size} tasks x {a.rollout.n} "
        f"per step | {length} | "
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


def train(cfg: DictConfig, source: Any = None, servers: Any = None, show_progress: bool = True,
          prepared: bool = False) -> dict[str, Any]:
    """Run a training config to the end; returns the trainer's summary.

    ``source``: a ``TrajectorySource`` (default: ``EnvRolloutSource`` over ``env.name``, or one per
    tag of ``env.tags``). ``servers``: a ``RolloutServers`` (default: started from
    ``actor_rollout_ref.rollout``); pass ``servers=False`` with a source that needs no policy
    servers (no weight sync). ``prepared``: ``preflight`` already ran on ``cfg`` (else it runs here).
    """
    from agentgym.trainer.async_config import is_async
    from agentgym.trainer.ppo_trainer import PPOTrainer

    if not prepared and source is None:
        from agentgym.trainer.preflight import preflight

        preflight(cfg)
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
        source = wrap_source(cfg, source)
        if is_async(cfg):
            from agentgym.trainer.async_trainer import AsyncPPOTrainer

            trainer = AsyncPPOTrainer(cfg, source, servers, show_progress=show_progress)
        else:
            trainer = PPOTrainer(cfg, source, servers, show_progress=show_progress)
        if cfg.trainer.val_only:
            return validate_only(trainer)
        summary = trainer.fit()
        write_ray_timeline(cfg)
        return summary
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
    """The trajectory source of the agent flow the config (or ``--agent``) names: the env's, or a
    black-box agent's through the gateway."""
    from agentgym.trainer.agent_flows import resolve_agent_flow

    flow = resolve_agent_flow(cfg, agent)
    if flow is not None:
        return _agent_source(cfg, flow, servers)
    return env_source(cfg, servers.client)


def env_source(cfg: DictConfig, client: Any) -> Any:
    """The trajectory source of an env run: one env, or several by tag (``env.tags``)."""
    if not cfg.env.name and not cfg.env.tags:
        raise ConfigError("no env to train on: pass --env NAME (see `agentgym envs`), data.train_files=FILE "
                          "(veRL rows), or --agent MODULE:FUNCTION")
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer

    template_kwargs = OmegaConf.to_container(cfg.data.apply_chat_template_kwargs, resolve=True) or None
    chat = ChatTokenizer(load_tokenizer(str(cfg.actor_rollout_ref.model.path)), template_kwargs=template_kwargs)
    if cfg.env.tags:
        from agentgym.trainer.multi_env_source import MultiEnvSource

        return MultiEnvSource(cfg, client, chat)
    from agentgym.trainer.sources import EnvRolloutSource

    return EnvRolloutSource(cfg, client, chat)


def wrap_source(cfg: DictConfig, source: Any) -> Any:
    """The source with the trainer-side reward manager (veRL's ``dapo`` overlong penalty) around it."""
    from agentgym.trainer.rewards import reward_manager_source

    return reward_manager_source(cfg, source)


def validate_only(trainer: Any) -> dict[str, Any]:
    """``trainer.val_only``: one validation run, logged as step 0, no workers and no training."""
    import time

    from agentgym.trainer.loggers import Tracking

    started = time.perf_counter()
    cfg = trainer.cfg
    trainer.run_dir.mkdir(parents=True, exist_ok=True)
    val = trainer.validate(0)
    tracking = Tracking(list(cfg.trainer.logger), trainer.run_dir, str(cfg.trainer.project_name),
                        str(cfg.trainer.experiment_name))
    try:
        tracking.log(val, 0)
    finally:
        tracking.close()
    return {"steps": 0, "seconds": time.perf_counter() - started, "metrics": {}, "val_metrics": val,
            "run_dir": str(trainer.run_dir), "checkpoint": None, "hf_model": None,
            "metrics_file": str(tracking.jsonl_path) if tracking.jsonl_path else None, "tensorboard": None,
            "samples_file": str(trainer.run_dir / "samples.jsonl"), "steps_run": 0, "flat_reward_steps": 0}


def write_ray_timeline(cfg: DictConfig) -> None:
    """``ray_init.timeline_json_file``: Ray's task timeline (chrome://tracing JSON), as veRL writes it."""
    path = cfg.ray_init.get("timeline_json_file")
    if not path or not cfg.trainer.use_ray:
        return
    import ray

    if ray.is_initialized():
        Path(str(path)).parent.mkdir(parents=True, exist_ok=True)
        ray.timeline(filename=str(path))


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
    """Make the trainer's and the config's warnings readable on the command line: ``agentgym train:
    warning: ...`` on stderr, above the progress bar. Left alone when the program has set up logging
    itself (the trainer's or the root logger has handlers). Returns the handler added, if any."""
    loggers = [logging.getLogger(name) for name in ("agentgym.trainer", "agentgym.config")]
    if any(lg.handlers for lg in loggers) or logging.getLogger().handlers:
        return None
    handler = ProgressSafeHandler(logging.WARNING)
    for lg in loggers:
        lg.addHandler(handler)
    return handler


def remove_handler(handler: logging.Handler | None) -> None:
    if handler is not None:
        for name in ("agentgym.trainer", "agentgym.config"):
            logging.getLogger(name).removeHandler(handler)


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
    handler = show_trainer_warnings()
    try:
        try:
            config_name = getattr(args, "config_name", None) or (
                "async_ppo_trainer" if getattr(args, "async_", False) else None)
            cfg = load_config(env=env, config_file=getattr(args, "config", None),
                              overrides=list(args.overrides or ()), agent=agent, config_name=config_name)
            from agentgym.trainer.agent_flows import resolve_agent_flow
            from agentgym.trainer.preflight import preflight

            flow = resolve_agent_flow(cfg) if agent is None else None  # actor_rollout_ref.rollout.agent
            if flow is not None:
                agent = getattr(flow, "__name__", "agent")

            plan = preflight(cfg, agent)
            if agent is None:
                if not cfg.env.name and not cfg.env.tags:
                    raise ConfigError("no env to train on: pass --env NAME (see `agentgym envs`), data.train_files=FILE "
                                      "(veRL rows: the env is chosen from their data_source) or --agent MODULE:FUNCTION")
                for name in _env_names(cfg):
                    _check_env(name)
        except ConfigError as exc:
            print(f"agentgym train: {exc}", file=sys.stderr)
            return 2
        print(describe(cfg, plan.steps), flush=True)
        for line in ([f"env chosen: {cfg.env.name} ({plan.env_chosen})"] if plan.env_chosen else []) + plan.notes:
            print(f"  {line}", flush=True)
        source = None
        servers = None
        if agent is not None:
            servers = rollout_servers(cfg)
            try:
                source = _agent_source(cfg, flow if flow is not None else agent, servers)
            except BaseException:
                servers.stop()
                raise
        summary = train(cfg, source=source, servers=servers, prepared=True)
    finally:
        remove_handler(handler)
    print(summary_text(summary), flush=True)
    return 0


def _env_names(cfg: DictConfig) -> list[str]:
    if cfg.env.tags or cfg.env.val_tags:
        from agentgym.trainer.env_groups import env_table

        table = env_table(cfg)
        return sorted({str(table[t]["env"]) for t in list(cfg.env.tags) + list(cfg.env.val_tags)})
    return [str(cfg.env.name)]
