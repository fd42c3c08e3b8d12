"""Run a training config to the end: ``train(cfg, source=...)``.

Builds the rollout side (policy servers, the trajectory source of the env or agent flow, the
trainer-side reward manager) and the trainer (``PPOTrainer``, or ``AsyncPPOTrainer`` when
``actor_rollout_ref.hybrid_engine=false``), runs ``fit()`` and returns its summary. Any
``TrajectorySource`` (``agentgym.rollout.sources``) plugs in here: this is where the gateway's
agent trajectories come in. The ``agentgym train`` command that runs the stages around this
(warm start, held-out table) is ``agentgym.stages.train_command``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.trainer.config import world_size

log = logging.getLogger("agentgym.trainer")


def describe(cfg: DictConfig, steps: int | None = None) -> str:
    """The status line: what runs, how long, where it writes."""
    a = cfg.actor_rollout_ref
    if steps is None:
        steps = cfg.trainer.total_training_steps
    length = f"{steps} steps" if steps is not None else f"{cfg.trainer.total_epochs} epoch(s) of the env's tasks"
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
    plan = s.plan(cfg.data.train_batch_size, None)
    return (
        f"\n  asynchronous: push every {s.trigger_parameter_sync_step} update(s), staleness_threshold "
        f"{s.staleness_threshold:g} -> at most {plan.budget} tasks beyond those trained, version lag <= "
        f"{plan.max_lag}; partial_rollout {str(s.partial_rollout).lower()}; rollout pool "
        f"{s.rollout_nnodes}x{s.rollout_n_gpus_per_node}"
    )


def train(
    cfg: DictConfig, source: Any = None, servers: Any = None, show_progress: bool = True, prepared: bool = False
) -> dict[str, Any]:
    """Run a training config to the end; returns the trainer's summary.

    ``source``: a ``TrajectorySource`` (default: ``EnvRolloutSource`` over ``env.name``, or one per
    tag of ``env.tags``). ``servers``: a ``RolloutServers`` (default: started from
    ``actor_rollout_ref.rollout``); pass ``servers=False`` with a source that needs no policy
    servers (no weight sync). ``prepared``: ``preflight`` already ran on ``cfg`` (else it runs here).
    """
    from agentgym.trainer.async_config import is_async
    from agentgym.trainer.ppo_trainer import PPOTrainer

    if not prepared and source is None:
        from agentgym.preflight import preflight

        preflight(cfg)
    from agentgym.trainer.run_storage import resolve_in_config

    resolve_in_config(cfg)  # one absolute run directory, on this driver, before anything writes there
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
    from agentgym.trainer.rollout_servers import RolloutServers

    return RolloutServers(cfg)


def flow_source(cfg: DictConfig, servers: Any, agent: Any = None) -> Any:
    """The trajectory source of the agent flow the config (or ``--agent``) names: the env's, or a
    black-box agent's through the gateway."""
    from agentgym.gateway.agent_flows import resolve_agent_flow

    flow = resolve_agent_flow(cfg, agent)
    if flow is not None:
        return agent_source(cfg, flow, servers)
    return env_source(cfg, servers.client)


def env_source(cfg: DictConfig, client: Any) -> Any:
    """The trajectory source of an env run: one env, or several by tag (``env.tags``)."""
    if not cfg.env.name and not cfg.env.tags:
        raise ConfigError(
            "no env to train on: pass --env NAME (see `agentgym envs`), data.train_files=FILE "
            "(veRL rows), or --agent MODULE:FUNCTION"
        )
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer

    template_kwargs = OmegaConf.to_container(cfg.data.apply_chat_template_kwargs, resolve=True) or None
    chat = ChatTokenizer(load_tokenizer(str(cfg.actor_rollout_ref.model.path)), template_kwargs=template_kwargs)
    if cfg.env.tags:
        from agentgym.rollout.multi_env_source import MultiEnvSource

        return MultiEnvSource(cfg, client, chat)
    from agentgym.rollout.sources import EnvRolloutSource

    return EnvRolloutSource(cfg, client, chat)


def wrap_source(cfg: DictConfig, source: Any) -> Any:
    """The source with the trainer-side reward sources around it (``agentgym.rewards``: a reward model or
    an LLM judge, veRL's reward manager, a distillation teacher), and around those dynamic sampling
    (``algorithm.filter_groups``), which judges the final scores."""
    from agentgym.rewards import reward_sources
    from agentgym.rollout.sources import filter_groups_active

    source = reward_sources(cfg, source)
    if cfg.algorithm.filter_groups.enable and not filter_groups_active(cfg):
        log.warning(
            "distillation.enable: algorithm.filter_groups (dynamic sampling) is off for this run: it judges env "
            "scores, and a group whose env scores are all equal still learns from the teacher"
        )
    if filter_groups_active(cfg) and cfg.actor_rollout_ref.hybrid_engine:  # the async trainer filters as groups form
        from agentgym.trainer.dynamic_sampling import DynamicSamplingSource

        source = DynamicSamplingSource.from_cfg(cfg, source)
    return source


def validate_only(trainer: Any) -> dict[str, Any]:
    """``trainer.val_only``: one validation run, logged as step 0, no workers and no training."""
    import time

    from agentgym.tracking import Tracking

    started = time.perf_counter()
    cfg = trainer.cfg
    trainer.run_dir.mkdir(parents=True, exist_ok=True)
    val = trainer.validate(0)
    tracking = Tracking(
        list(cfg.trainer.logger), trainer.run_dir, str(cfg.trainer.project_name), str(cfg.trainer.experiment_name)
    )
    try:
        tracking.log(val, 0)
    finally:
        tracking.close()
    return {
        "steps": 0,
        "seconds": time.perf_counter() - started,
        "metrics": {},
        "val_metrics": val,
        "run_dir": str(trainer.run_dir),
        "checkpoint": None,
        "hf_model": None,
        "metrics_file": str(tracking.jsonl_path) if tracking.jsonl_path else None,
        "tensorboard": None,
        "samples_file": str(trainer.run_dir / "samples.jsonl"),
        "steps_run": 0,
        "flat_reward_steps": 0,
    }


def write_ray_timeline(cfg: DictConfig) -> None:
    """``ray_init.timeline_json_file``: Ray's task timeline (chrome://tracing JSON), as veRL writes it."""
    path = cfg.ray_init.timeline_json_file
    if not path or not cfg.trainer.use_ray:
        return
    import ray

    if ray.is_initialized():
        Path(str(path)).parent.mkdir(parents=True, exist_ok=True)
        ray.timeline(filename=str(path))


def agent_source(cfg: DictConfig, agent: Any, servers: Any) -> Any:
    """The gateway's trajectory source for ``--agent module:function``."""
    from agentgym.gateway.agent_source import trajectory_source

    return trajectory_source(cfg, agent, servers)
