"""``agentgym rollout``: run episodes against a policy and save token-exact trajectories.

Its flags (shared with ``agentgym eval``: ``episode_arguments``), and the start of an embedded policy server
when no ``--server`` is given; the episodes themselves run in ``agentgym.rollout.commands``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentgym.config_schema.flags import config_flag
from agentgym.stages.from_run import Given

ROLLOUT = "actor_rollout_ref.rollout"

RUN_HELP = {
    "eval": "With --run DIR it scores a finished run's model as the run's held-out table did: the run's env with "
    "env.kwargs + env.val_kwargs, its turn and token limits, prompt/response lengths, chat-template "
    "variables, validation sampling (greedy), seeds from env.val_seed_start and held_out.num_tasks tasks; "
    "it prints each setting and where it came from, and any flag given wins.",
    "rollout": "With --run DIR it rolls out a finished run's model with the run's training settings: env.kwargs, "
    "turn and token limits, lengths, chat-template variables, actor_rollout_ref.rollout sampling; "
    "it prints each setting and where it came from, and any flag given wins.",
}


def episode_arguments(parser: argparse.ArgumentParser, mode: str) -> None:
    """The flags of ``agentgym rollout`` (``mode="rollout"``) and ``agentgym eval``. Those a finished run can
    supply (``--run``) note themselves in ``args.given``."""
    from agentgym.envs import env_args

    evaluating = mode == "eval"
    parser.description = f"{parser.description}. {RUN_HELP[mode]}" if parser.description else RUN_HELP[mode]
    parser.set_defaults(given=frozenset())
    p = parser
    p.add_argument(
        "--env",
        action=Given,
        help="registered env name"
        + ("; without it (and --run), eval scores a file: data.path=FILE" if evaluating else ""),
    )
    p.add_argument(
        "--run",
        default=None,
        metavar="DIR",
        help="take the settings from a finished run (a run directory, or a checkpoint or model "
        "directory inside it): its model, env and env kwargs, limits, lengths, sampling"
        + (", held-out seeds and tasks" if evaluating else "")
        + "; flags given win",
    )
    p.add_argument(
        "--model",
        action=Given,
        default="tiny",
        help="'%(default)s' (default), an HF model directory (a LoRA run's adapter directory too) or a hub name",
    )
    p.add_argument(
        "--server",
        action="append",
        metavar="URL",
        help="policy server base URL (repeatable); default: start an embedded server",
    )
    p.add_argument(
        "-n", "--n", type=int, action=Given, default=1 if evaluating else 8, help="episodes per task (%(default)s)"
    )
    if evaluating:
        p.add_argument("--tasks", type=int, action=Given, help="number of tasks (seeds or dataset rows)")
    else:
        p.add_argument("--tasks", type=int, default=8, help="number of tasks (seeds or dataset rows; %(default)s)")
    p.add_argument("--seed", type=int, action=Given, default=0, help="first seed (%(default)s)")
    config_flag(p, "--concurrency", key=f"{ROLLOUT}.concurrency", action=Given)
    p.add_argument("--max-turns", type=int, action=Given, help="most model turns (the env's own)")
    p.add_argument("--max-tokens", type=int, action=Given, default=256, help="max new tokens per turn (%(default)s)")
    config_flag(p, "--context-policy", key=f"{ROLLOUT}.multi_turn.context_policy", action=Given)
    config_flag(p, "--context-window", key=f"{ROLLOUT}.multi_turn.context_window", action=Given)
    # eval samples as validation does (greedy), rollout as training does
    sampling = f"{ROLLOUT}.val_kwargs" if evaluating else ROLLOUT
    config_flag(p, "--temperature", key=f"{sampling}.temperature", action=Given)
    config_flag(p, "--top-p", key=f"{sampling}.top_p", action=Given)
    config_flag(p, "--top-k", key=f"{sampling}.top_k", action=Given)
    config_flag(p, "--sampling-seed", key=f"{ROLLOUT}.sampling_seed", action=Given)
    # no default here: --run takes the run's, else the embedded server's context decides
    unset = "unset: the run's with --run, else 4096"
    config_flag(p, "--prompt-length", key="data.max_prompt_length", action=Given, default=None, help=unset)
    config_flag(p, "--response-length", key="data.max_response_length", action=Given, default=None, help=unset)
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=env_args.HELP)
    p.add_argument(
        "--device",
        action=Given,
        help="the embedded server's device: cpu or cuda (default: cuda if available)",
    )
    p.add_argument("--out", default=None, help="trajectory file (.jsonl or .parquet)")
    p.add_argument(
        "--backend", choices=["embedded", "vllm", "sglang"], default="embedded", help="the API of the --server URLs"
    )
    config_flag(p, "--env-executor", key="env.executor", action=Given)
    p.add_argument("--env-workers", type=int, default=None, help="processes / actors for the executor")
    p.add_argument("--env-url", action="append", metavar="URL", help="--env-executor openenv: an env server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    episode_arguments(parser, "rollout")


def run(args: argparse.Namespace) -> int:
    return against_servers(args, "rollout")


def against_servers(args: argparse.Namespace, mode: str, after: Any = None) -> int:
    """``rollout``/``eval``: against ``--server`` URLs, or an embedded server started here on ``--model``."""
    from agentgym.rollout.commands import check_env, run_command
    from agentgym.stages.from_run import RunError, settle_rollout_args

    try:
        settle_rollout_args(args, mode)  # --run: the run's settings under the flags given
    except (RunError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.server:
        return run_command(args, mode, list(args.server), args.backend, after)
    error = check_env(args.env)  # before the server start, which takes seconds
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import time

    from agentgym.server.launch import start_embedded_server

    print(f"starting an embedded policy server on {args.model} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    # --run: batches as wide as the held-out scoring's (its server batches rollout.concurrency episodes)
    server = start_embedded_server(
        model=args.model,
        port=0,
        max_batch_size=args.concurrency if args.run else 32,
        max_model_len=args.max_model_len,
        device=args.device,
    )
    print(f"server ready at {server.url} ({time.perf_counter() - started:.1f}s)", file=sys.stderr)
    try:
        return run_command(args, mode, [server.url], "embedded", after)
    finally:
        server.stop()
