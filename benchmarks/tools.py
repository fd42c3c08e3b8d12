"""Tool-call round trips per second: parse a Hermes tool call from model text, run it, format the reply.

    .venv/bin/python benchmarks/tools.py [--seconds 3] [--threads 8]

Rows: parsing alone; the calculator (in the caller's thread, and on a watchdog thread as
``Toolbox`` runs it by default); the sandboxed Python tool in each sandbox mode (``--modes``:
strong = bubblewrap namespaces, weak = the in-process audit hook), one call at a time and from
``--threads`` threads at once. A mode that cannot run here is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from agentgym.envs.tools import Toolbox, parse_tool_calls  # noqa: E402
from agentgym.envs.tools.calculator import CalculatorTool  # noqa: E402
from agentgym.envs.tools.python import PythonTool  # noqa: E402
from agentgym.envs.tools.sandbox import SandboxUnavailable, run_python  # noqa: E402

CALC_TEXT = (
    "She has 16 - 3 - 4 eggs left and sells each for $2. "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "(16 - 3 - 4) * 2"}}</tool_call>'
)
PY_TEXT = (
    "Let me check with Python. "
    '<tool_call>{"name": "python", "arguments": {"code": "eggs = 16 - 3 - 4\\nprint(eggs * 2)"}}</tool_call>'
)


def round_trip(box: Toolbox, text: str) -> str:
    """Model text in, tool message content out."""
    _, calls, errors = parse_tool_calls(text)
    results = box.run_turn(calls, errors, used=0)
    assert results and results[0].ok, results[0].text
    return results[0].message()["content"]


def measure(fn: Callable[[], object], seconds: float, threads: int = 1) -> tuple[float, int, list[float]]:
    """Calls per second of ``fn`` over ``seconds`` (from ``threads`` threads), the call count and
    each call's seconds."""
    fn()  # warm up
    deadline = time.perf_counter() + seconds
    durations: list[float] = []

    def loop() -> int:
        n = 0
        while time.perf_counter() < deadline:
            begin = time.perf_counter()
            fn()
            durations.append(time.perf_counter() - begin)
            n += 1
        return n

    start = time.perf_counter()
    if threads == 1:
        count = loop()
    else:
        with ThreadPoolExecutor(threads) as pool:
            count = sum(pool.map(lambda _: loop(), range(threads)))
    return count / (time.perf_counter() - start), count, durations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per row")
    parser.add_argument("--threads", type=int, default=8, help="threads for the concurrent Python row")
    parser.add_argument("--modes", default="strong,weak", help="sandbox modes to time, comma-separated")
    args = parser.parse_args()

    calc_inline = Toolbox([CalculatorTool()], call_timeout_s=None)
    calc_watchdog = Toolbox([CalculatorTool()])
    assert round_trip(calc_inline, CALC_TEXT) == "18"
    rows = [
        ("parse Hermes call only", lambda: parse_tool_calls(CALC_TEXT), 1),
        ("calculator (inline)", lambda: round_trip(calc_inline, CALC_TEXT), 1),
        ("calculator (watchdog thread)", lambda: round_trip(calc_watchdog, CALC_TEXT), 1),
    ]
    layers = {}
    for mode in args.modes.split(","):
        try:
            python = Toolbox([PythonTool(timeout_s=10, sandbox=mode)])
        except SandboxUnavailable as exc:
            print(f"python sandbox {mode}: skipped ({exc})", flush=True)
            continue
        assert round_trip(python, PY_TEXT) == "18"
        layers[mode] = run_python("pass", mode=mode).layers
        rows += [
            (f"python sandbox ({mode}), sequential", lambda box=python: round_trip(box, PY_TEXT), 1),
            (
                f"python sandbox ({mode}), {args.threads} threads",
                lambda box=python: round_trip(box, PY_TEXT),
                args.threads,
            ),
        ]
    for mode, names in layers.items():
        print(f"python sandbox {mode} layers: {', '.join(names)}", flush=True)
    print(f"cpus: {os.cpu_count()}", flush=True)
    print(f"{'round trip':<40} {'calls/s':>12} {'ms/call':>9} {'p50 ms':>8} {'p90 ms':>8} {'calls':>8}")
    for name, fn, threads in rows:
        print(f"{name:<40} ", end="", flush=True)
        rate, count, durations = measure(fn, args.seconds, threads)
        p50, p90 = (1000 * q for q in statistics.quantiles(durations, n=10)[4::4]) if len(durations) > 1 else (0, 0)
        print(f"{rate:>12,.1f} {1000 * threads / rate:>9.3f} {p50:>8.2f} {p90:>8.2f} {count:>8}", flush=True)
    print(json.dumps({"layers": layers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
