"""Rollout runner throughput: Sokoban turns/s against stand-in servers vs raw client calls/s.

The stand-in servers (``tests/support/standin_server.py``, child processes in ``fixed`` mode) answer
every ``/v1/completions`` instantly with ``<answer>Up</answer><|im_end|>``, so what is measured is
agentgym's side: the runner (chat-template deltas, env steps, bookkeeping) plus the HTTP client.

Two tables:

* **scale-out** (``--workers``, default ``1 2 N`` with N the CPU count): the runner with
  ``env_executor=workers`` and K worker processes (each a runner of its own, envs inline),
  against the raw ceiling with the same K: K processes each making the same number of raw
  ``client.generate`` calls (a fixed prompt as long as the runner's average request), rate =
  all calls / (last finish - first start). ``in-process`` is the runner without workers (the
  one-process ceiling), against one raw process.
* **concurrency** (``--concurrency``, default ``64 256``): the in-process runner at each
  concurrency against one raw process, with the CPU time per turn / per call (steadier than
  rates on a busy machine).

Each measurement alternates runner and raw ``--repeat`` times and shows medians.

    python benchmarks/rollout.py                               # both tables
    python benchmarks/rollout.py --workers 1 2 16 --servers 4  # on a 16-core machine
    python benchmarks/rollout.py --table concurrency --concurrency 256 --env-executor thread
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

from agentgym.client import PolicyClient
from agentgym.rollout import RolloutConfig, RolloutRunner
from agentgym.types import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script, only benchmarks/ is on the path
    sys.path.insert(0, str(ROOT))
from tests.support.standin_server import start_standin  # noqa: E402  (the stand-in the tests use)

SOKOBAN_MOVE = "<answer>Up</answer><|im_end|>"


async def bench_runner(
    urls: list[str], concurrency: int, turns: int, args: argparse.Namespace, executor: str, workers: int | None = None
) -> dict[str, float]:
    episodes = max(1, turns // args.max_turns)
    n = min(8, episodes)
    config = RolloutConfig(
        n=n,
        max_turns=args.max_turns,
        max_tokens=32,
        max_concurrency=concurrency,
        env_executor=executor,
        env_workers=workers,
        worker_env_executor="inline",
        template_check_every=args.template_check_every,
    )
    async with PolicyClient(urls) as client:
        runner = RolloutRunner(args.env, client, tokenizer="tiny", config=config)
        await runner.run(tasks=max(1, (workers or 1) * 2))  # warm-up: workers, env build, caches, connections
        start, cpu = time.perf_counter(), time.process_time()
        result = await runner.run(tasks=max(1, episodes // n))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        await runner.aclose()
    trajs = result.trajectories
    done = sum(t.num_turns for t in trajs)
    sent = []  # the sequence sent on each turn: the raw calls use a prompt as long as the average
    for t in trajs:
        length = 0
        for turn in t.turns:
            length += len(turn.prompt_ids)
            sent.append(length)
            length += len(turn.response_ids)
    cache = (
        runner.chat.cache_hits / max(1, runner.chat.cache_hits + runner.chat.cache_misses)
        if executor != "workers"
        else float("nan")
    )
    return {
        "turns": done,
        "elapsed": elapsed,
        "rate": done / elapsed,
        "cpu_us": cpu / done * 1e6,
        "failed": sum(t.status == "failed" for t in trajs),
        "mean_prompt": sum(sent) / len(sent),
        "cache_hit": cache,
    }


async def raw_calls(
    urls: list[str], concurrency: int, calls: int, prompt_len: int, start_at: float | None = None
) -> dict[str, float]:
    """``calls`` raw generate calls, ``concurrency`` at a time; ``start_at``: a wall-clock time to begin."""
    prompt = [i % 600 for i in range(prompt_len)]
    sampling = SamplingParams(max_tokens=32)
    async with PolicyClient(urls) as client:
        await asyncio.gather(*(client.generate(prompt, sampling) for _ in range(min(calls, concurrency))))
        remaining = [calls]

        async def worker(k: int) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await client.generate(prompt, sampling, session_id=f"raw/{k}")

        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        start, cpu, wall = time.perf_counter(), time.process_time(), time.time()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "calls": calls,
        "elapsed": elapsed,
        "rate": calls / elapsed,
        "cpu_us": cpu / calls * 1e6,
        "wall_start": wall,
        "wall_end": wall + elapsed,
    }


def _raw_process(args: tuple[list[str], int, int, int, float]) -> dict[str, float]:
    return asyncio.run(raw_calls(*args))


def bench_raw(urls: list[str], concurrency: int, calls: int, prompt_len: int, processes: int) -> dict[str, float]:
    """The raw ceiling with ``processes`` client processes sharing ``calls`` and ``concurrency``."""
    if processes == 1:
        return asyncio.run(raw_calls(urls, concurrency, calls, prompt_len))
    ctx = multiprocessing.get_context("forkserver")
    start_at = time.time() + 3.0  # every process connected and warmed up before the common start
    per = [(urls, max(1, concurrency // processes), calls // processes, prompt_len, start_at) for _ in range(processes)]
    with ctx.Pool(processes) as pool:
        parts = pool.map(_raw_process, per)
    total = sum(p["calls"] for p in parts)
    elapsed = max(p["wall_end"] for p in parts) - min(p["wall_start"] for p in parts)
    return {
        "calls": total,
        "elapsed": elapsed,
        "rate": total / elapsed,
        "cpu_us": statistics.mean(p["cpu_us"] for p in parts),
    }


def scale_out_table(urls: list[str], args: argparse.Namespace) -> list[str]:
    rows = []
    plan = [("in-process", args.env_executor, None)] + [(f"workers {k}", "workers", k) for k in args.workers]
    for label, executor, workers in plan:
        runs, raws = [], []
        for _ in range(args.repeat):  # alternate, so a burst of load elsewhere hits both sides
            r = asyncio.run(bench_runner(urls, args.scale_concurrency, args.turns, args, executor, workers))
            raw = bench_raw(urls, args.scale_concurrency, int(r["turns"]), int(r["mean_prompt"]), workers or 1)
            runs.append(r)
            raws.append(raw)
            print(
                f"  {label}: runner {r['rate']:.0f} turns/s, raw {raw['rate']:.0f} calls/s "
                f"({workers or 1} process{'es' if (workers or 1) > 1 else ''})",
                file=sys.stderr,
                flush=True,
            )
        rows.append((label, workers or 1, runs, raws))
    lines = [
        f"\nscale-out: env={args.env} concurrency={args.scale_concurrency} max_turns={args.max_turns} "
        f"servers={len(urls)} repeat={args.repeat} (medians) cpus={os.cpu_count()} "
        f"load={os.getloadavg()[0]:.1f}",
        f"{'runner':>12} {'raw procs':>9} {'turns':>7} {'runner turns/s':>15} {'raw calls/s':>12} {'ratio':>6} "
        f"{'failed':>7}",
    ]
    for label, procs, runs, raws in rows:
        rate = statistics.median(r["rate"] for r in runs)
        raw_rate = statistics.median(r["rate"] for r in raws)
        lines.append(
            f"{label:>12} {procs:>9} {runs[0]['turns']:>7} {rate:>15.0f} {raw_rate:>12.0f} "
            f"{rate / raw_rate:>6.2f} {sum(x['failed'] for x in runs):>7}"
        )
    return lines


def concurrency_table(urls: list[str], args: argparse.Namespace) -> list[str]:
    rows = []
    for concurrency in args.concurrency:
        turns = args.turns if concurrency > 1 else max(args.max_turns, args.turns // 8)
        runs, raws = [], []
        for _ in range(args.repeat):
            r = asyncio.run(bench_runner(urls, concurrency, turns, args, args.env_executor))
            raw = bench_raw(urls, concurrency, int(r["turns"]), int(r["mean_prompt"]), 1)
            runs.append(r)
            raws.append(raw)
            print(
                f"  concurrency {concurrency}: runner {r['rate']:.0f} turns/s, raw {raw['rate']:.0f} calls/s",
                file=sys.stderr,
                flush=True,
            )
        rows.append((concurrency, runs, raws))
    lines = [
        f"\nconcurrency: env={args.env} env_executor={args.env_executor} max_turns={args.max_turns} "
        f"template_check_every={args.template_check_every} repeat={args.repeat} (medians) "
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}",
        f"{'concurrency':>11} {'turns':>7} {'runner turns/s':>15} {'raw calls/s':>12} {'ratio':>6} "
        f"{'cpu us/turn':>12} {'cpu us/call':>12} {'mean prompt':>12} {'delta cache hit':>16} {'failed':>7}",
    ]
    for concurrency, runs, raws in rows:
        rate = statistics.median(r["rate"] for r in runs)
        raw_rate = statistics.median(r["rate"] for r in raws)
        cpu = statistics.median(r["cpu_us"] for r in runs)
        raw_cpu = statistics.median(r["cpu_us"] for r in raws)
        r = runs[0]
        lines.append(
            f"{concurrency:>11} {r['turns']:>7} {rate:>15.0f} {raw_rate:>12.0f} {rate / raw_rate:>6.2f} "
            f"{cpu:>12.0f} {raw_cpu:>12.0f} {r['mean_prompt']:>12.0f} {r['cache_hit']:>16.2f} "
            f"{sum(x['failed'] for x in runs):>7}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--table", choices=["both", "scale-out", "concurrency"], default="both")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=None,
        help="worker processes for the scale-out table (default: 1 2 CPUs)",
    )
    parser.add_argument("--scale-concurrency", type=int, default=256, help="episodes in flight, scale-out table")
    parser.add_argument("--servers", type=int, default=1, help="stand-in server processes (least-busy routing)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--turns", type=int, default=8000, help="turns per measurement")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument(
        "--env-executor",
        default="inline",
        choices=["inline", "thread", "process"],
        help="the in-process runner's executor",
    )
    parser.add_argument("--template-check-every", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="measurements per row (median shown)")
    args = parser.parse_args()
    if args.workers is None:
        args.workers = sorted({1, 2, os.cpu_count() or 1})
    servers = [start_standin(mode="fixed", text=SOKOBAN_MOVE, version=1) for _ in range(args.servers)]
    urls = [s.url for s in servers]
    try:
        lines = []
        if args.table in ("both", "scale-out"):
            lines += scale_out_table(urls, args)
        if args.table in ("both", "concurrency"):
            lines += concurrency_table(urls, args)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
