"""MCP tool calls: start-up, round trip, throughput, the hanging-call bound and a dead server's answer.

    .venv/bin/python benchmarks/mcp_tools.py [--calls 300] [--threads 8]

Against the tests' FastMCP server (tests/support/mcp_server.py), over stdio and streamable HTTP,
through ``Toolbox.execute`` as an env runs a call (Hermes parsing aside: see benchmarks/tools.py).
Rows: connecting (start, handshake, tool list); ``add`` one call at a time (p50 / p95 ms) and from
``--threads`` threads; ``sleep_forever`` under ``call_timeout_s`` 0.5 / 1 / 2 s (what a hanging call
costs); ``crash`` then a call (how fast a dead server is reported).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from agentgym.envs.tools import Toolbox  # noqa: E402
from agentgym.envs.tools.mcp import mcp_tools  # noqa: E402

SERVER = os.path.join(os.path.dirname(__file__), "..", "tests", "support", "mcp_server.py")


def call(box: Toolbox, name: str, **arguments):
    return box.execute({"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}})


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(label: str, server: dict, calls: int, threads: int) -> None:
    start = time.perf_counter()
    box = Toolbox(mcp_tools([{**server, "shared": False}]), call_timeout_s=None)
    print(f"{label:6} connect (start + handshake + list)   {1000 * (time.perf_counter() - start):8.1f} ms")
    try:
        times = [timed(lambda: call(box, "add", a=2, b=3)) for _ in range(calls)]
        assert call(box, "add", a=2, b=3).text == "5"
        cuts = statistics.quantiles(times, n=20)
        print(
            f"{label:6} add, one at a time        p50 {1000 * statistics.median(times):6.2f} ms  "
            f"p95 {1000 * cuts[18]:6.2f} ms"
        )
        with ThreadPoolExecutor(threads) as pool:
            start = time.perf_counter()
            list(pool.map(lambda _: call(box, "add", a=1, b=1), range(calls)))
            rate = calls / (time.perf_counter() - start)
        print(f"{label:6} add, {threads} threads              {rate:8.0f} calls/s")
    finally:
        box.close()
    for timeout in (0.5, 1.0, 2.0):
        box = Toolbox(mcp_tools([{**server, "shared": False, "call_timeout_s": timeout}]), call_timeout_s=None)
        try:
            took = timed(lambda box=box: call(box, "sleep_forever"))
            after = timed(lambda box=box: call(box, "add", a=1, b=1))
            print(
                f"{label:6} hanging call, timeout {timeout:3.1f} s     costs {took:6.3f} s "
                f"(next call {1000 * after:.1f} ms)"
            )
        finally:
            box.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    stdio = {"name": "bench", "command": sys.executable, "args": [SERVER]}
    measure("stdio", stdio, args.calls, args.threads)
    box = Toolbox(mcp_tools([{**stdio, "shared": False, "max_restarts": 0}]), call_timeout_s=None)
    call(box, "crash")
    took = timed(lambda: call(box, "add", a=1, b=1))
    print(f"stdio  dead server: the next call's error after {1000 * took:.2f} ms")
    box.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            time.sleep(0.05)
        measure("http", {"name": "bench", "url": f"http://127.0.0.1:{port}/mcp"}, args.calls, args.threads)
    finally:
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
