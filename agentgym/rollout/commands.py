"""``agentgym rollout`` and ``agentgym eval``: run an env against a policy from the command line.

    agentgym rollout --env sokoban --model tiny -n 8 --out runs/x.jsonl
    agentgym eval --env gsm8k --model PATH --env-arg data_files=data/gsm8k/test.jsonl

Both run against the policy servers at ``--server URL`` (the command line starts an embedded
server on ``--model`` when none is given; ``--model`` also names the tokenizer whose chat
template renders the prompts). ``rollout``
saves token-exact trajectories (``--out``, .jsonl or .parquet) and prints batch metrics;
``eval`` prints success rate, mean reward, pass@k (unbiased estimator), mean turns and tokens,
overall and per data source, and saves trajectories too when ``--out`` is given. The command line
(``agentgym.stages.rollout_command``, ``eval_command``) declares the flags; ``agentgym.stages.from_run``
settles ``args`` before ``run_command``: ``env_kwargs``, ``chat_template_kwargs``, ``max_model_len`` and,
with ``--run DIR``, the flags the finished run supplies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgym.types import Trajectory

EVAL_SEEDS = 32  # tasks `agentgym eval` runs on an env of seeds (no dataset) without --tasks


def parse_env_args(pairs: list[str] | None) -> dict[str, Any]:
    """``--env-arg`` pairs -> kwargs (``agentgym.envs.env_args``); a malformed pair ends the command."""
    from agentgym.envs.env_args import parse_env_args as parse

    try:
        return parse(pairs)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def check_env(name: str) -> str | None:
    """None when ``name`` is a registered env, else the error to print (with the closest names)."""
    from agentgym.registry import UnknownNameError, env_spec

    try:
        env_spec(name)
    except UnknownNameError as exc:
        return str(exc)
    return None


def run_command(
    args: argparse.Namespace,
    mode: str,
    urls: list[str],
    backend: str,
    after: Callable[[list[Trajectory]], Awaitable[None]] | None = None,
) -> int:
    """``agentgym rollout`` (``mode="rollout"``) or ``agentgym eval`` against the servers at ``urls``
    (the command line starts an embedded server first when no ``--server`` is given). ``after``: run on
    every trajectory once the table is printed (``eval --judge-url``: an LLM judge's scores)."""
    error = check_env(args.env)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args, mode, urls, backend, after))
    except KeyboardInterrupt:
        print("\ninterrupted; trajectories written so far are complete lines", file=sys.stderr)
        return 130


async def _main(
    args: argparse.Namespace,
    mode: str,
    urls: list[str],
    backend: str,
    after: Callable[[list[Trajectory]], Awaitable[None]] | None = None,
) -> int:
    from agentgym.client import PolicyClient
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.rollout.metrics import format_eval_table, format_metrics
    from agentgym.rollout.runner import RolloutConfig, RolloutRunner
    from agentgym.rollout.storage import TrajectoryWriter

    env_kwargs = args.env_kwargs
    chat = ChatTokenizer(load_tokenizer(args.model), template_kwargs=args.chat_template_kwargs)
    lengths = {
        k: int(v)
        for k, v in (("prompt_length", args.prompt_length), ("response_length", args.response_length))
        if v is not None
    }
    config = RolloutConfig(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        max_concurrency=args.concurrency,
        seed=args.seed,
        sampling_seed=args.sampling_seed,
        env_executor=args.env_executor,
        env_workers=args.env_workers,
        env_urls=list(args.env_url or ()),
        context_policy=args.context_policy,
        context_window=args.context_window,
        **lengths,
    )
    writer = None
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(PolicyClient(urls, backend=backend))
        config.max_model_len = await client.max_model_len()  # episodes end as truncated when it is full
        runner = RolloutRunner(args.env, client, chat, config, env_kwargs=env_kwargs)
        stack.push_async_callback(runner.aclose)
        try:
            info = await runner.env_info()
        except Exception as exc:  # noqa: BLE001 - a bad --env-arg, missing data: say so
            print(
                f"error: could not build env {args.env!r} with {env_kwargs}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 2
        count = args.tasks  # rollout's has a default; eval's is the env's dataset
        if count is None:
            count = info["num_tasks"] if info["num_tasks"] is not None else EVAL_SEEDS
        tasks = await runner.tasks(count)
        if args.out:
            writer = TrajectoryWriter(args.out)
            stack.callback(writer.close)
        print(
            f"{mode}: env={args.env} tasks={len(tasks)} n={config.n} -> {len(tasks) * config.n} episodes, "
            f"concurrency {config.max_concurrency}, temperature {config.temperature}",
            file=sys.stderr,
        )
        result = await runner.run(tasks, on_trajectory=writer.write if writer else None, progress=f"{mode} {args.env}")

    metrics = result.metrics
    if mode == "eval":
        print(format_eval_table(metrics))
    else:
        sources = {t.data_source for t in result.trajectories}
        shown = (
            metrics
            if len(sources) > 1
            else {k: v for k, v in metrics.items() if not any(k.startswith(f"{s}/") for s in sources)}
        )
        print(format_metrics(shown))
    if after is not None:
        await after(result.trajectories)
    failed = [t for t in result.trajectories if t.status == "failed"]
    if writer is not None:
        print(f"\nwrote {writer.count} trajectories to {args.out}", file=sys.stderr)
    if failed:
        print(
            f"{len(failed)} of {len(result.trajectories)} episodes failed; first: {failed[0].failure}", file=sys.stderr
        )
        if len(failed) == len(result.trajectories):
            print(
                "every episode failed: check the server (--server URL, or the --model it was started on) "
                "and the env arguments (--env-arg KEY=VALUE)",
                file=sys.stderr,
            )
            return 1
    return 0
