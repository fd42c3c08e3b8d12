"""Rollout runner overhead: Sokoban turns/s against a stand-in server vs raw client calls/s.

The stand-in server (``benchmarks/standin_server.py``, a child process in ``fixed`` mode) answers
every ``/v1/completions`` instantly with ``<answer>Up</answer><|im_end|>``, so what is measured is
agentgym's side: the runner (chat-template deltas, env steps, bookkeeping) plus the HTTP
client. For each concurrency the same number of raw ``client.generate`` calls, with a fixed
prompt as long as the runner's average request, gives the ceiling the client itself allows.
Each measurement alternates runner and raw ``--repeat`` times and shows medians; the CPU
columns (this process's CPU time per turn / per call) are steadier than rates on a busy machine.

    python benchmarks/rollout.py                       # concurrency 1, 64, 256
    python benchmarks/rollout.py --concurrency 256 --turns 20000 --env-executor thread
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from standin_server import start_standin  # benchmarks/ (this script's directory)

from agentgym.client import PolicyClient
from agentgym.rollout import RolloutConfig, RolloutRunner
from agentgym.types import SamplingParams

SOKOBAN_MOVE = "<answer>Up</answer><|im_end|>"


async def bench_runner(url: str, concurrency: int, turns: int, args: argparse.Namespace) -> dict[str, float]:
    episodes = max(1, turns // args.max_turns)
    n = min(8, episodes)
    config = RolloutConfig(n=n, max_turns=args.max_turns, max_tokens=32, max_concurrency=concurrency,
                           env_executor=args.env_executor, template_check_every=args.template_check_every)
    async with PolicyClient(url) as client:
        runner = RolloutRunner(args.env, client, tokenizer="tiny", config=config)
        await runner.run(tasks=1)  # warm-up: env build, template caches, connections
        start, cpu = time.perf_counter(), time.process_time()
        result = await runner.run(tasks=max(1, episodes // n))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        await runner.aclose()
    trajs = result.trajectories
    done = sum(t.num_turns for t in trajs)
    # average request length: the sequence sent on each turn
    sent = []
    for t in trajs:
        length = 0
        for turn in t.turns:
            length += len(turn.prompt_ids)
            sent.append(length)
            length += len(turn.response_ids)
    failed = sum(t.status == "failed" for t in trajs)
    return {"turns": done, "elapsed": elapsed, "rate": done / elapsed, "failed": failed, "cpu_us": cpu / done * 1e6,
            "mean_prompt": sum(sent) / len(sent), "cache_hit": runner.chat.cache_hits /
            max(1, runner.chat.cache_hits + runner.chat.cache_misses)}


async def bench_raw(url: str, concurrency: int, calls: int, prompt_len: int) -> dict[str, float]:
    prompt = [i % 600 for i in range(prompt_len)]
    sampling = SamplingParams(max_tokens=32)
    async with PolicyClient(url) as client:
        await asyncio.gather(*(client.generate(prompt, sampling) for _ in range(min(calls, concurrency))))
        remaining = [calls]

        async def worker(k: int) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await client.generate(prompt, sampling, session_id=f"raw/{k}")

        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"calls": calls, "elapsed": elapsed, "rate": calls / elapsed, "cpu_us": cpu / calls * 1e6}


async def main_async(args: argparse.Namespace) -> None:
    proc = start_standin(mode="fixed", text=SOKOBAN_MOVE, version=1)
    url = proc.url
    try:
        rows = []
        for concurrency in args.concurrency:
            turns = args.turns if concurrency > 1 else max(args.max_turns, args.turns // 8)
            runs, raws = [], []
            for _ in range(args.repeat):  # alternate, so a burst of load elsewhere hits both sides
                r = await bench_runner(url, concurrency, turns, args)
                raw = await bench_raw(url, concurrency, int(r["turns"]), int(r["mean_prompt"]))
                runs.append(r)
                raws.append(raw)
                print(f"  concurrency {concurrency}: runner {r['rate']:.0f} turns/s, raw {raw['rate']:.0f} calls/s",
                      file=sys.stderr, flush=True)
            rows.append((concurrency, runs, raws))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"\nenv={args.env} env_executor={args.env_executor} max_turns={args.max_turns} "
          f"template_check_every={args.template_check_every} "
          f"repeat={args.repeat} (medians) cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    print(f"{'concurrency':>11} {'turns':>7} {'runner turns/s':>15} {'raw calls/s':>12} {'ratio':>6} "
          f"{'cpu us/turn':>12} {'cpu us/call':>12} {'mean prompt':>12} {'delta cache hit':>16} {'failed':>7}")
    for concurrency, runs, raws in rows:
        rate = statistics.median(r["rate"] for r in runs)
        raw_rate = statistics.median(r["rate"] for r in raws)
        cpu = statistics.median(r["cpu_us"] for r in runs)
        raw_cpu = statistics.median(r["cpu_us"] for r in raws)
        r = runs[0]
        print(f"{concurrency:>11} {r['turns']:>7} {rate:>15.0f} {raw_rate:>12.0f} {rate / raw_rate:>6.2f} "
              f"{cpu:>12.0f} {raw_cpu:>12.0f} {r['mean_prompt']:>12.0f} {r['cache_hit']:>16.2f} "
              f"{sum(x['failed'] for x in runs):>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--turns", type=int, default=8000, help="turns per measurement (1/8 of it at concurrency 1)")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--env-executor", default="inline", choices=["inline", "thread", "process"])
    parser.add_argument("--template-check-every", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="measurements per concurrency (median shown)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
