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
    from agentgym.trainer.worker_group import default_ray_auth

    default_ray_auth()
    from agentgym.stages.train_command import (
        held_out_report,
        prepare_training,
        remove_handler,
        run_stages,
        show_trainer_warnings,
    )

    handler = show_trainer_warnings()
    try:
        cfg, plan, agent = prepare_training(
            env, agent, None if config is None else str(config), overrides, asynchronous=asynchronous
        )
        summary, start_scores = run_stages(cfg, plan, agent, show_progress=show_progress)
        if cfg.held_out.enable:
            held_out_report(cfg, start_scores, summary)
            written = Path(str(summary["run_dir"])) / "held_out.json"
            if written.is_file():
                summary["held_out"] = json.loads(written.read_text())
        return summary
    finally:
        remove_handler(handler)
