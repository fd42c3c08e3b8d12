"""Workspace sandbox speed: episode start-up, a ``bash`` call's round trip, tool calls/s with many episodes.

    .venv/bin/python benchmarks/workspace.py [--starts 40] [--calls 200] [--concurrency 1 8 32] [--per-episode 20]

Rows (medians; failures counted, never hidden):

* **start-up (cold)**: ``WorkspaceSandbox(limits, files)`` until its server says ready and the
  task's files are written, then ``close``: what a reset pays when no spare is ready.
* **reset with a spare**: ``SparePool.take(files)`` when the spare started ahead is ready (what
  ``WorkspaceEnv.reset`` pays between episodes: the task's files written into it).
* **bash round trip**: ``sandbox.run("true")`` on a warm sandbox (the host -> server -> bash -> kill
  sweep -> host path every bash call takes); also a ``read_file``-sized read.
* **concurrent episodes**: N threads, each an episode: start a sandbox, ``--per-episode`` tool calls
  (bash writes a file, read_file reads it back, str_replace-sized write), close. Calls/s over all
  episodes, the median call, failed calls and failed episodes.
* **anchor**: one fresh container per episode (``docker run --rm <image> true``) where an engine
  answers; otherwise the row says why there is none.

Prints ``os.getloadavg()`` before and after: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from agentgym.envs.workspace.sandbox import (  # noqa: E402
    SparePool,
    WorkspaceLimits,
    WorkspaceSandbox,
    workspace_problem,
)

FILES = {"src/app.py": "def add(a, b):\n    return a - b\n", "README.md": "# task\n", "tests/test_app.py": "x = 1\n"}
LIMITS = WorkspaceLimits(timeout_s=10.0, memory_mb=1024, max_processes=64, max_disk_mb=64)


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):8.2f}" if values else "     n/a"


def startup(n: int) -> tuple[list[float], int]:
    times, failures = [], 0
    for _ in range(n):
        begin = time.perf_counter()
        try:
            box = WorkspaceSandbox(LIMITS, FILES)
        except Exception as exc:  # noqa: BLE001 - counted and shown
            failures += 1
            print(f"  start-up failed: {exc}", file=sys.stderr)
            continue
        times.append(time.perf_counter() - begin)
        box.close()
    return times, failures


def warm_resets(n: int) -> list[float]:
    pool = SparePool(LIMITS, size=1)
    times = []
    try:
        for _ in range(n):
            deadline = time.monotonic() + 30
            while not pool._ready and time.monotonic() < deadline:  # the spare of the previous take
                time.sleep(0.01)
            begin = time.perf_counter()
            box = pool.take(FILES)
            times.append(time.perf_counter() - begin)
            box.close()
    finally:
        pool.close()
    return times


def round_trips(n: int) -> tuple[list[float], list[float]]:
    with WorkspaceSandbox(LIMITS, FILES) as box:
        box.run("true")
        bash, reads = [], []
        for _ in range(n):
            begin = time.perf_counter()
            assert box.run("true").ok
            bash.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            assert box.read("src/app.py").exists
            reads.append(time.perf_counter() - begin)
    return bash, reads


def episode(per_episode: int, durations: list[float], lock: threading.Lock) -> tuple[int, int]:
    """One episode's calls; ``(calls done, calls failed)``. Raises if the episode itself failed."""
    done = failed = 0
    with WorkspaceSandbox(LIMITS, FILES) as box:
        for i in range(per_episode):
            begin = time.perf_counter()
            try:
                if i % 3 == 0:
                    ok = box.run(f"echo {i} > out.txt && cat out.txt").output == f"{i}\n"
                elif i % 3 == 1:
                    ok = box.read("out.txt").data == f"{i - 1}\n".encode()
                else:
                    box.write("src/app.py", FILES["src/app.py"].replace("a - b", f"a + b + {i}"))
                    ok = True
            except Exception as exc:  # noqa: BLE001 - counted
                print(f"  call failed: {exc}", file=sys.stderr)
                ok = False
            with lock:
                durations.append(time.perf_counter() - begin)
            done += 1
            failed += not ok
    return done, failed


def concurrent(episodes: int, per_episode: int) -> dict[str, float]:
    durations: list[float] = []
    lock = threading.Lock()
    begin = time.perf_counter()
    calls = failed_calls = failed_episodes = 0
    with ThreadPoolExecutor(episodes) as pool:
        futures = [pool.submit(episode, per_episode, durations, lock) for _ in range(episodes)]
        for future in futures:
            try:
                done, failed = future.result()
                calls += done
                failed_calls += failed
            except Exception as exc:  # noqa: BLE001 - counted
                failed_episodes += 1
                print(f"  episode failed: {exc}", file=sys.stderr)
    wall = time.perf_counter() - begin
    return {
        "episodes": episodes,
        "calls": calls,
        "calls_per_s": calls / wall,
        "median_call_ms": 1000 * statistics.median(durations) if durations else float("nan"),
        "failed_calls": failed_calls,
        "failed_episodes": failed_episodes,
        "wall_s": wall,
    }


def container_anchor(image: str, n: int) -> str:
    for engine in ("docker", "podman"):
        exe = shutil.which(engine)
        if exe is None:
            continue
        probe = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            why = (probe.stderr.strip() or probe.stdout.strip()).splitlines()[-1:] or ["no output"]
            print(f"  {engine}: installed, but its daemon does not answer ({why[0][:160]})")
            continue
        times = []
        for _ in range(n):
            begin = time.perf_counter()
            result = subprocess.run(
                [exe, "run", "--rm", "--network", "none", image, "true"], capture_output=True, timeout=120
            )
            if result.returncode != 0:
                return f"{engine} run failed: {result.stderr.decode(errors='replace').strip()[:200]}"
            times.append(time.perf_counter() - begin)
        return f"{engine} run --rm {image} true: median {1000 * statistics.median(times):.0f} ms over {n}"
    return "no container engine answers here (docker/podman absent or daemon down): no anchor figure"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-episode", type=int, default=20)
    parser.add_argument("--image", default="alpine:latest")
    args = parser.parse_args()
    problem = workspace_problem()
    if problem is not None:
        print(f"the workspace sandbox cannot run here: {problem}")
        return 1
    print(f"cpus: {os.cpu_count()}  load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with WorkspaceSandbox(LIMITS) as box:
        print(f"layers: {', '.join(box.layers)}")
    starts, start_failures = startup(args.starts)
    print(f"{'start-up, cold (no spare)':<34} median {ms(starts)} ms   failures {start_failures}/{args.starts}")
    warm = warm_resets(args.starts)
    print(f"{'reset with a spare ready':<34} median {ms(warm)} ms")
    bash, reads = round_trips(args.calls)
    print(
        f"{'bash round trip (true)':<34} median {ms(bash)} ms   p90 {1000 * sorted(bash)[int(0.9 * len(bash))]:.2f} ms"
    )
    print(f"{'read_file round trip':<34} median {ms(reads)} ms")
    rows = []
    print(f"{'episodes':>9} {'calls':>7} {'calls/s':>9} {'median ms':>10} {'failed calls':>13} {'failed eps':>11}")
    for n in args.concurrency:
        row = concurrent(n, args.per_episode)
        rows.append(row)
        print(
            f"{n:>9} {row['calls']:>7} {row['calls_per_s']:>9.1f} {row['median_call_ms']:>10.2f} "
            f"{row['failed_calls']:>13} {row['failed_episodes']:>11}",
            flush=True,
        )
    print(f"anchor: {container_anchor(args.image, 5)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    summary = {
        "startup_ms": 1000 * statistics.median(starts) if starts else None,
        "warm_reset_ms": 1000 * statistics.median(warm),
        "bash_ms": 1000 * statistics.median(bash),
        "concurrent": rows,
    }
    print(json.dumps(summary))
    failures = start_failures + sum(r["failed_calls"] + r["failed_episodes"] for r in rows)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
