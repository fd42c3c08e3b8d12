"""``agentgym.train``: the ``agentgym train`` command as a Python call.

    import agentgym
    result = agentgym.train(env="sokoban", overrides=["trainer.total_training_steps=20"])
    print(result["run_dir"], result["held_out"]["table"])

It runs the same stages as the command (preflight, the warm start, the held-out scores of the model RL
starts from, RL, the held-out table; see ``agentgym.stages.train_command``) and returns the trainer's
summary. Everything heavy (torch, Ray, the trainer) is imported only when ``train`` is called, so
``import agentgym`` stays light.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def train(
    env: str | None = None,
    overrides: Sequence[str] = (),
    *,
    config: str | os.PathLike[str] | None = None,
    agent: str | Callable[..., Any] | None = None,
    asynchronous: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Train as ``agentgym train`` does and return the run's summary.

    ``env``: a registered env name (``agentgym envs``), as ``--env``. ``overrides``: dotted
    ``key=value`` strings, as on the command line (``["trainer.total_training_steps=20",
    "warm_start.enable=false"]``). ``config``: a YAML file (agentgym's keys, or veRL / ROLL / ChatLearn /
    Claw-R1 ones, translated), as ``--config``. ``agent``: a black-box agent trained through the gateway,
    ``"module:function"`` or the function itself, as ``--agent``. ``asynchronous``: the asynchronous
    trainer (``configs/async_ppo_trainer.yaml``), as ``--async``.

    The summary holds ``run_dir``, ``steps``, ``seconds``, the last step's ``metrics``, ``val_metrics``,
    ``hf_model`` (the final model's directory), ``checkpoint``, ``samples_file``, ... and, when the
    held-out table ran (``held_out.enable``), ``held_out``: the content of the run's ``held_out.json``
    (``table`` is the printed table). A bad config raises ``agentgym.config.ConfigError`` saying what to
    change; a run that stops raises the trainer's error."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from agentgym.config import ConfigError
    from agentgym.preflight import preflight
    from agentgym.stages.config_command import resolve_command_line
    from agentgym.stages.train_command import _check_env as check_env
    from agentgym.stages.train_command import _env_names as env_names
    from agentgym.stages.train_command import (
        check_stages,
        held_out_report,
        remove_handler,
        run_start_stages,
        show_trainer_warnings,
    )
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import agent_source, describe, rollout_servers
    from agentgym.trainer.run import train as run_training

    handler = show_trainer_warnings()
    try:
        line = resolve_command_line(None if config is None else str(config), list(overrides))
        try:
            cfg = load_config(
                env=env,
                config_file=line.config_file,
                overrides=line.overrides,
                agent=agent if isinstance(agent, str) or agent is None else _agent_name(agent),
                config_name=line.config_name or ("async_ppo_trainer" if asynchronous else None),
            )
        finally:
            line.delete()
        from agentgym.gateway.agent_flows import resolve_agent_flow

        flow = resolve_agent_flow(cfg) if agent is None else None  # actor_rollout_ref.rollout.agent
        plan = preflight(cfg, None if agent is None and flow is None else _agent_name(agent or flow))
        if agent is None and flow is None:
            if not cfg.env.name and not cfg.env.tags:
                raise ConfigError(
                    "no env to train on: pass env=NAME (see `agentgym envs`), data.train_files=FILE in "
                    "overrides (veRL rows: the env is chosen from their data_source) or agent=MODULE:FUNCTION"
                )
            for name in env_names(cfg):
                check_env(name)
        check_stages(cfg)
        if show_progress:
            print(describe(cfg, plan.steps), flush=True)
        start_scores = run_start_stages(cfg)
        source = servers = None
        if agent is not None or flow is not None:
            servers = rollout_servers(cfg)
            try:
                source = agent_source(cfg, agent if agent is not None else flow, servers)
            except BaseException:
                servers.stop()
                raise
        summary = run_training(cfg, source=source, servers=servers, show_progress=show_progress, prepared=True)
        if cfg.held_out.enable:
            held_out_report(cfg, start_scores, summary)
            written = Path(str(summary["run_dir"])) / "held_out.json"
            if written.is_file():
                summary["held_out"] = json.loads(written.read_text())
        return summary
    finally:
        remove_handler(handler)


def _agent_name(agent: Any) -> str:
    if isinstance(agent, str):
        return agent
    return f"{getattr(agent, '__module__', 'agent')}:{getattr(agent, '__name__', 'agent')}"
