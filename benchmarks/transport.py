"""PolicyClient's transport: the hand-written HTTP/1.1 client (``http11``) vs httpx keep-alive pools.

The same ``PolicyClient.generate`` calls (token ids in, ids + logprobs out; a prompt of ``--prompt``
tokens) go to the same instant stand-in (``tests/support/standin_server.py``, ``fixed`` mode, a child
process), closed-loop at each concurrency, over three transports:

* ``http11``: what ``PolicyClient`` uses for ``http://`` servers (``agentgym`` ``http11.ConnectionPool``:
  request bytes written by hand, responses parsed by httptools);
* ``httpx``: one ``httpx.AsyncClient`` with an HTTP/1.1 keep-alive pool as large as the concurrency;
* ``httpx-pools``: ``HTTPPools`` (httpx clients of 4 connections each, what ``PolicyClient`` uses
  for ``https://``).

Everything but the transport is the same code, so the difference in this process's CPU per call is
the transport's. Each transport runs ``--repeat`` times, interleaved, and the medians are printed.

    python benchmarks/transport.py                         # concurrency 1, 64, 256
    python benchmarks/transport.py --concurrency 256 --calls 20000 --loop asyncio
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script, only benchmarks/ is on the path
    sys.path.insert(0, str(ROOT))
from tests.support.standin_server import start_standin  # noqa: E402  (the stand-in the tests use)

TRANSPORTS = ("http11", "httpx", "httpx-pools")


def make_client(url: str, transport: str, concurrency: int) -> Any:
    """A ``PolicyClient`` on ``url`` whose server is reached over ``transport``."""
    import httpx

    from agentgym.client import policy as policy_client

    client = policy_client.PolicyClient(url, max_connections=max(concurrency, 1), timeout=60.0)
    if transport == "http11":
        return client
    server = client.servers[0]
    if transport == "httpx":
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        pools = policy_client.HTTPPools(
            concurrency, size=concurrency, limits=limits, timeout=httpx.Timeout(60.0, connect=10.0)
        )
    else:
        pools = policy_client.HTTPPools(concurrency, size=4, timeout=httpx.Timeout(60.0, connect=10.0))
    server.transport = policy_client.HttpxTransport(server.url, pools)
    return client


async def run_one(url: str, transport: str, concurrency: int, calls: int, prompt: int) -> dict[str, float]:
    from agentgym.types import SamplingParams

    client = make_client(url, transport, concurrency)
    sampling = SamplingParams(max_tokens=16, temperature=1.0)
    prompt_ids = [(7 * i) % 500 + 3 for i in range(prompt)]
    latencies: list[float] = []

    async def worker(n: int, record: bool) -> None:
        for _ in range(n):
            t = time.perf_counter()
            await client.generate(prompt_ids, sampling, session_id=None)
            if record:
                latencies.append(time.perf_counter() - t)

    try:
        await asyncio.gather(*(worker(4, False) for _ in range(concurrency)))  # warm-up: connections open
        per = max(1, calls // concurrency)
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(per, True) for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        await client.aclose()
    ms = sorted(x * 1e3 for x in latencies)
    n = len(ms)
    return {
        "calls_per_s": n / elapsed,
        "p50_ms": ms[n // 2],
        "p99_ms": ms[min(n - 1, int(n * 0.99))],
        "cpu_ms_per_call": cpu / n * 1e3,
    }


def run(concurrencies: list[int], calls: int, repeat: int, prompt: int, loop: str) -> None:
    import os

    standin = start_standin(0, mode="fixed")
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        for c in concurrencies:
            for _ in range(repeat):
                for transport in TRANSPORTS:
                    results.setdefault((c, transport), []).append(
                        _run_loop(run_one(standin.url, transport, c, calls, prompt), loop)
                    )
    finally:
        standin.kill()
        standin.wait()

    print(
        f"\nPolicyClient.generate over each transport to an instant stand-in; prompt {prompt} tokens, "
        f"{calls} calls per run, medians of {repeat} interleaved runs; event loop: {loop}; "
        f"{os.cpu_count()} CPU(s) shared with the stand-in; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'concurrency':>11} {'transport':<12} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'client CPU ms/call':>19}"
    )
    for c in concurrencies:
        base = None
        for transport in TRANSPORTS:
            runs = results[(c, transport)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            base = base or med
            extra = (
                ""
                if transport == "http11"
                else f"   ({med['cpu_ms_per_call'] / base['cpu_ms_per_call']:.1f}x http11's CPU)"
            )
            print(
                f"{c:>11} {transport:<12} {med['calls_per_s']:>8.0f} {med['p50_ms']:>8.2f} {med['p99_ms']:>8.2f} "
                f"{med['cpu_ms_per_call']:>19.3f}{extra}"
            )


def _run_loop(main: Any, loop: str) -> dict[str, float]:
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,64,256", help="comma list")
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=200, help="prompt length in tokens")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="asyncio: the rollout runner's loop; uvloop: the gateway's",
    )
    args = parser.parse_args(argv)
    run([int(c) for c in args.concurrency.split(",")], args.calls, args.repeat, args.prompt, args.loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
