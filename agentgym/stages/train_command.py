"""``agentgym train``: the stages in order — preflight, the warm start (demos -> SFT), the held-out
scores of the model RL starts from, RL (``agentgym.trainer.run.train``), the held-out table — and the
summary, exit codes and signal handling of the command.

    agentgym train --env sokoban
    agentgym train --env sokoban data.train_batch_size=8 algorithm=ppo trainer.logger=[console,tensorboard]
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agentgym.config import ConfigError
from agentgym.config_schema.train import TrainerSettings
from agentgym.trainer.config import load_config
from agentgym.trainer.run import agent_source, describe, rollout_servers, train
from agentgym.trainer.run_storage import resolve_in_config


def _check_env(name: str) -> None:
    from agentgym.registry import env_spec

    try:
        env_spec(name)
    except KeyError as exc:
        raise ConfigError(str(exc)) from None


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
        lines[0] += (
            f", but the policy learned nothing: every group got identical rewards at every step "
            f"({flat} of {run}), so all advantages were zero (see the warning above)"
        )
    keys = (
        "reward/mean",
        "outcome_reward/mean",
        "success_rate",
        "response_length/mean",
        "turns/mean",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "timing_s/step",
        "weight_sync/save_s",
        "weight_sync/load_s",
    )
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
        lines.append(
            f"  final model: {summary['hf_model']} (agentgym serve --model {summary['hf_model']}; score it "
            f"with the run's env settings: agentgym eval --run {summary['run_dir']})"
        )
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.stages.config_command import hydra_arguments

    parser.epilog = (
        "Every key, its default and where a value comes from: agentgym config --show --env NAME [KEY=VALUE ...]; "
        "the keys with their help: configs/train.yaml."
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--env", help="registered env name; picks configs/env/<name>.yaml when present")
    target.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="train an agent program (OpenAI or Anthropic client) through the gateway",
    )
    parser.add_argument(
        "--config",
        "--config-file",
        default=None,
        help="a YAML config to start from (default: configs/train.yaml); a ROLL, ChatLearn, Claw-R1 or "
        "Hydra-composed veRL file is translated first (as `agentgym config --from`)",
    )
    hydra_arguments(
        parser,
        "a named config beside configs/train.yaml (e.g. async_ppo_trainer); with --config-path, "
        "the file DIR/NAME.yaml (Hydra's form)",
    )
    parser.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="asynchronous training: rollout and training overlap (--config-name async_ppo_trainer)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, veRL names")


def run(args: argparse.Namespace) -> int:
    """The ``agentgym train`` subcommand. Exit codes: 0 done, 1 the run stopped (its rollouts kept
    failing, or a checkpoint cannot be resumed: the message says why), 2 a bad config, 128 + N a signal."""
    from agentgym.trainer.worker_group import default_ray_auth

    default_ray_auth()
    from agentgym.trainer.checkpoint import CheckpointError
    from agentgym.trainer.step_checks import TrainingFailed
    from agentgym.trainer.worker_group import ClusterUnreachable
    from agentgym.trainer.workers import quiet_transformers

    quiet_transformers()  # no per-load progress bars between our own progress lines
    env, agent = args.env, args.agent
    threads_before = set(threading.enumerate())
    handler = show_trainer_warnings()
    restore_signals = exit_on_signals()
    code = 0
    cfg = None
    try:
        try:
            cfg, plan, agent = prepare_training(
                env, agent, args.config, args.overrides, args.config_path, args.config_name, args.async_
            )
        except ConfigError as exc:
            print(f"agentgym train: {exc}", file=sys.stderr)
            return 2
        summary, start_scores = run_stages(cfg, plan, agent)
        print(summary_text(summary), flush=True)
        if cfg.held_out.enable:
            held_out_report(cfg, start_scores, summary)
    except (TrainingFailed, CheckpointError, ClusterUnreachable) as exc:
        print(f"agentgym train: error: {exc}", file=sys.stderr, flush=True)
        code = 1
    except ConfigError as exc:  # found once the workers run (a run directory other nodes do not see)
        print(f"agentgym train: {exc}", file=sys.stderr, flush=True)
        code = 2
    except SystemExit as exc:  # SIGTERM / SIGHUP (exit_on_signals): everything above has cleaned up
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        restore_signals()
        remove_handler(handler)
    # a config that failed to load has no trainer.shutdown_timeout yet: the schema's default then
    timeout = cfg.trainer.shutdown_timeout if cfg is not None else TrainerSettings.shutdown_timeout
    return exit_without_stuck_threads(code, timeout, threads_before)


def prepare_training(
    env: str | None,
    agent: Any,
    config_file: str | None,
    overrides: Any,
    config_path: str | None = None,
    config_name: str | None = None,
    asynchronous: bool = False,
) -> tuple[DictConfig, Any, Any]:
    """Everything ``agentgym train`` and ``agentgym.train`` check before any work: the composed config, the
    preflight plan, and what produces the trajectories (``agent``, the config's agent flow, or None: the env).
    Raises ``ConfigError`` with what to change."""
    from agentgym.gateway.agent_flows import resolve_agent_flow
    from agentgym.preflight import preflight
    from agentgym.stages.config_command import resolve_command_line
    from agentgym.trainer.weight_sync import refuse_unreachable_urls

    line = resolve_command_line(config_file, list(overrides or ()), config_path, config_name)
    for note in line.notes:
        print(f"agentgym train: {note}", file=sys.stderr, flush=True)
    try:
        cfg = load_config(
            env=env,
            config_file=line.config_file,
            overrides=line.overrides,
            agent=None if agent is None else agent_name(agent),
            config_name=line.config_name or ("async_ppo_trainer" if asynchronous else None),
        )
    finally:
        line.delete()
    # the run directory, absolute, before any stage writes there (the warm start, the held-out cache)
    resolve_in_config(cfg)
    if agent is None:
        agent = resolve_agent_flow(cfg)  # actor_rollout_ref.rollout.agent
    plan = preflight(cfg, None if agent is None else agent_name(agent))
    if agent is None:
        if not cfg.env.name and not cfg.env.tags:
            raise ConfigError(
                "no env to train on: pass --env NAME (env=NAME from Python; see `agentgym envs`), "
                "data.train_files=FILE (veRL rows: the env is chosen from their data_source) or --agent MODULE:FUNCTION"
            )
        for name in _env_names(cfg):  # before the stages, which look the env up too
            _check_env(name)
    check_stages(cfg)
    refuse_unreachable_urls(cfg)  # vLLM/SGLang by URL on another host: before the warm start, not after it
    return cfg, plan, agent


def check_cluster_storage(cfg: DictConfig) -> None:
    """A run whose trainer joins a Ray cluster: every node that can hold a trainer rank must see the run
    directory, checked before the first stage (the warm start's demos and SFT come before RL's workers,
    which check it again); ``RunDirNotShared`` says what to do."""
    from agentgym.trainer.resource_pools import POOL_RESOURCE
    from agentgym.trainer.run_storage import check_nodes_share
    from agentgym.trainer.worker_group import init_ray, ray_address

    if not (cfg.trainer.use_ray and ray_address(cfg)):
        return  # a cluster agentgym starts itself is this machine
    import ray

    connected_here = not ray.is_initialized()
    init_ray(cfg)
    try:
        check_nodes_share(cfg.trainer.default_local_dir, POOL_RESOURCE["trainer"])
    finally:
        if connected_here:  # each stage connects as it would have
            ray.shutdown()


def run_stages(cfg: DictConfig, plan: Any, agent: Any, show_progress: bool = True) -> tuple[dict[str, Any], Any]:
    """The run after ``prepare_training``: the warm start and the start scores, then RL (on the env, or on
    ``agent`` through the gateway). Returns the trainer's summary and the start scores for the held-out table."""
    if show_progress:
        print(describe(cfg, plan.steps), flush=True)
        for line in ([f"env chosen: {cfg.env.name} ({plan.env_chosen})"] if plan.env_chosen else []) + plan.notes:
            print(f"  {line}", flush=True)
    check_cluster_storage(cfg)
    start_scores = run_start_stages(cfg)
    source = servers = None
    if agent is not None:
        servers = rollout_servers(cfg)
        try:
            source = agent_source(cfg, agent, servers)
        except BaseException:
            servers.stop()
            raise
    return train(cfg, source=source, servers=servers, show_progress=show_progress, prepared=True), start_scores


def agent_name(agent: Any) -> str:
    """``module:function`` for an agent given as that string or as the function (or an agent flow)."""
    if isinstance(agent, str):
        return agent
    return f"{getattr(agent, '__module__', 'agent')}:{getattr(agent, '__name__', 'agent')}"


def check_stages(cfg: DictConfig) -> None:
    """The warm start's and the held-out evaluation's settings, before any work starts."""
    from agentgym.stages import held_out, warm_start

    warm_start.check(cfg)
    if cfg.held_out.enable:
        if not cfg.env.name or cfg.env.tags:
            raise ConfigError("held_out needs one env (env.name); set held_out.enable=false")
        held_out.check_disjoint(
            cfg, {"RL task": held_out.rl_seed_range(cfg), "demonstration": warm_start.demo_seeds(cfg)}
        )


def run_start_stages(cfg: DictConfig) -> dict[float, Any]:
    """Before RL: the warm start (demos -> SFT; the SFT model becomes the policy), then the held-out
    scores of the model RL starts from."""
    from agentgym.stages import held_out
    from agentgym.stages.warm_start import run_warm_start

    if cfg.warm_start.enable:
        print(f"warm start: RL starts from the SFT model {run_warm_start(cfg)}", flush=True)
    if not cfg.held_out.enable:
        return {}
    return held_out.start_scores(cfg, str(cfg.actor_rollout_ref.model.path))


def held_out_report(cfg: DictConfig, start: dict[float, Any], summary: dict[str, Any]) -> None:
    """After RL: the final model on the same held-out tasks; prints the table, writes held_out.json."""
    from agentgym.stages import held_out

    if not summary.get("hf_model"):
        print("held-out: no final model to score (trainer.save_hf_model is off)", flush=True)
        return
    final = {
        float(t): held_out.score_model(cfg, str(summary["hf_model"]), float(t), f"held-out RL T={float(t):g}")
        for t in cfg.held_out.temperatures
    }  # not cached: the final model is written anew by every run
    random_score = held_out.score_random(cfg) if cfg.held_out.random_policy else None
    start_label = "after SFT" if cfg.warm_start.enable else "before RL"
    rows = {start_label: start, "after RL": final}
    text = held_out.table(cfg, rows, random_score, start_label, "after RL")
    run_dir = Path(str(summary["run_dir"]))
    held_out.save(
        run_dir / "held_out.json",
        rows,
        random_score,
        {"table": text, "start_model": str(cfg.actor_rollout_ref.model.path), "final_model": str(summary["hf_model"])},
    )
    (run_dir / "held_out.txt").write_text(text + "\n")
    print(f"\n{text}\n  (written to {run_dir / 'held_out.txt'})", flush=True)


def _env_names(cfg: DictConfig) -> list[str]:
    if cfg.env.tags or cfg.env.val_tags:
        from agentgym.rollout.env_groups import env_table

        table = env_table(cfg)
        return sorted({str(table[t]["env"]) for t in list(cfg.env.tags) + list(cfg.env.val_tags)})
    return [str(cfg.env.name)]


def exit_on_signals() -> Callable[[], None]:
    """Make SIGTERM and SIGHUP end the run like an exception (``SystemExit(128 + signal)``), so every
    ``finally`` and ``atexit`` cleanup runs (shared-memory weight files, servers, Ray); returns a
    function that puts the previous handlers back. Only the main thread can do this."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def exit_without_stuck_threads(code: int, timeout: float, before: set[threading.Thread]) -> int:
    """``code``, once the threads the run started have ended. Threads still running after ``timeout``
    seconds (``trainer.shutdown_timeout``: an env step or an agent that never returns; Python cannot
    stop a thread) would keep the interpreter alive forever at exit: then the ``atexit`` cleanups run
    and the process exits with ``code`` without waiting for them."""
    deadline = time.monotonic() + timeout
    started = [t for t in threading.enumerate() if t not in before and not t.daemon]
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in started if t.is_alive()]
    if not stuck:
        return code
    print(
        f"agentgym train: {len(stuck)} thread(s) still running {timeout:g} s after the run ended "
        f"({', '.join(sorted(stuck)[:5])}): a hung env call or agent? Exiting without waiting for them "
        "(trainer.shutdown_timeout).",
        file=sys.stderr,
        flush=True,
    )
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
