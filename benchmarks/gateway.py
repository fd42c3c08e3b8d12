"""Gateway overhead: calls through the gateway vs direct calls to the same instant stand-in server.

    python benchmarks/gateway.py                    # 256 concurrent sessions, 20 s per side
    python benchmarks/gateway.py --workers 2        # agentgym gateway --workers 2
    python benchmarks/gateway.py --delay-ms 100     # the stand-in takes 100 ms per generation
    python benchmarks/gateway.py --peer rllm-model-gateway   # vs the peer, at 1, 64 and 256 sessions

Three programs share the machine: this client, the gateway (``agentgym gateway [--workers N]``)
and the stand-in policy server (``tests/support/standin_server.py`` in ``fixed`` mode, a child
process: a bare asyncio HTTP/1.1 server answering ``/v1/completions`` with token ids + logprobs
and ``/v1/chat/completions`` with a canned reply, both ``The answer is 72.``, instantly, from
prebuilt bytes). Both sides send the same chat request from the same lean load generator
(``Pools``: agentgym's own keep-alive client, ``agentgym.client.http11``):

* direct: ``POST standin/v1/chat/completions``;
* gateway: ``POST <base_url>/chat/completions`` (one session per concurrent client, each of
  ``TURNS`` calls re-sending the history; every call renders the chat, calls the stand-in's
  ``/v1/completions`` token-in/out, records the turn and answers in OpenAI's shape; a session is
  created before and finished after its calls).

``--peer rllm-model-gateway`` measures agentgym's gateway (finished sessions in memory, and with
``--store sqlite``) against that peer gateway (PyPI ``rllm-model-gateway`` 0.1.0, started from its own
venv, ``$AGENTGYM_PEER_PYTHON``; it proxies the stand-in's vLLM-shaped ``/vllm/v1/chat/completions``
and records each call in its default SQLite trace store), all in one run at 1, 64 and 256 concurrent
sessions: calls/s, p50/p99 latency added over direct calls, and each gateway's CPU ms per call.

Printed: throughput (calls/s) and latency p50/p99 per side at the chosen concurrency, the
gateway's added latency under that load (gateway minus direct), the unloaded added latency
(one call at a time), and each program's CPU ms per call (the gateway's summed over its worker
processes). On a small machine the programs compete for the same cores, so the loaded figures
measure CPU sharing as much as the gateway: with an instant stand-in the direct path costs a few
hundredths of a millisecond of CPU per call, so its rate is bounded by the load generator, while
the gateway path is bounded by CPUs / (total CPU per call). The last line says how much CPU per
call the gateway could spend for the gateway path to reach 0.8x of direct on this machine.
``--delay-ms`` gives the stand-in a generation time, as a real server has.

The process helpers here (``start_gateway_process``, ``stop``, ``free_port``, and
``start_standin``, imported from ``tests/support/standin_server.py``) are also what ``tests/gateway/`` uses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, only benchmarks/ is on the path
    sys.path.insert(0, str(ROOT))

from tests.support.standin_server import start_standin  # noqa: E402  (tests start it through this module)

# ---- the programs under test -------------------------------------------------------------------
ADMIN_KEY = "sk-agentgym-benchmark-admin"
"""The admin key of the gateways started here (unless ``env`` names another)."""


def start_gateway_process(
    port: int,
    servers: list[str],
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    workers: int = 1,
    extra: list[str] | None = None,
) -> subprocess.Popen:
    """``agentgym gateway`` in a child process (admin key ``ADMIN_KEY``), returned once it answers
    ``/health``; ``extra``: more command-line arguments (``["--store", "sqlite:PATH"]``)."""
    env = {"AGENTGYM_GATEWAY_ADMIN_KEY": ADMIN_KEY, **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "gateway",
        "--model",
        "tiny",
        "--port",
        str(port),
        "--workers",
        str(workers),
        *(extra or []),
    ]
    for url in servers:
        cmd += ["--server", url]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    _wait_health(f"http://127.0.0.1:{port}", proc, timeout)
    return proc


PEER = "rllm-model-gateway"
PEER_PYTHON = os.environ.get("AGENTGYM_PEER_PYTHON", "/work/venvs/rllm/bin/python")
PEER_INSTALL = (
    f"python -m venv /work/venvs/rllm && /work/venvs/rllm/bin/pip install {PEER}==0.1.0 uvloop httptools "
    "(or point $AGENTGYM_PEER_PYTHON at a Python that has it)"
)


def start_peer_process(
    port: int, standin_url: str, db_path: str, python: str = PEER_PYTHON, timeout: float = 60.0, store: str = "sqlite"
) -> subprocess.Popen:
    """``rllm-model-gateway`` (its own CLI; its trace store ``store``: its default SQLite at ``db_path``,
    or ``memory``) in a child process of ``python`` (its own venv: its dependencies are not agentgym's),
    in front of the stand-in's vLLM-shaped chat route, returned once it answers ``/health``."""
    if not Path(python).exists():
        raise SystemExit(f"--peer {PEER}: no Python at {python}; install the peer in its own venv: {PEER_INSTALL}")
    cmd = [
        python,
        "-m",
        "rllm_model_gateway",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker",
        f"{standin_url}/vllm/v1",
        "--db-path",
        db_path,
        "--store",
        store,
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_health(f"http://127.0.0.1:{port}", proc, timeout)
    return proc


def _wait_health(url: str, proc: subprocess.Popen, timeout: float) -> None:
    from agentgym.client.health import wait_healthy

    if wait_healthy(url, lambda: proc.poll() is not None, timeout, interval=0.05):
        return
    if proc.poll() is not None:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise RuntimeError(f"{url} exited with {proc.returncode} before answering:\n{err[-2000:]}")
    proc.kill()
    raise RuntimeError(f"{url} did not answer /health within {timeout:.0f}s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the benchmark client --------------------------------------------------------------------------
class Pools:
    """The load generator's connections: agentgym's lean keep-alive client (``http11.ConnectionPool``),
    one pool per ``host:port`` (a multi-worker gateway's sessions live on their workers' own ports)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pools: dict[tuple[str, int], Any] = {}

    async def post(
        self, url: str, path: str, payload: dict[str, Any] | None, key: str | None = None, method: str = "POST"
    ) -> tuple[int, bytes]:
        from agentgym.client.http11 import ConnectionPool

        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        pool = self.pools.get((host, int(port)))
        if pool is None:
            pool = self.pools[(host, int(port))] = ConnectionPool(host, int(port), self.limit)
        answer = await pool.fetch(
            method,
            path,
            None if payload is None else json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {key}"} if key else None,
        )
        return answer.status, answer.body

    async def aclose(self) -> None:
        for pool in self.pools.values():
            await pool.aclose()


TURNS = 4  # chat calls per session; each re-sends the history and adds a user message


def _messages(turn: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for k in range(turn + 1):
        messages.append({"role": "user", "content": f"Question {k}: what is {k} + 70?"})
        if k < turn:
            messages.append({"role": "assistant", "content": "The answer is 72."})
    return messages


async def _open(kind: str, url: str, pools: Pools) -> tuple[str | None, str | None, str]:
    """A session on ``kind`` (``gateway``: agentgym's; ``peer``: rllm-model-gateway's; ``direct``: none):
    ``(session id, api key, the URL its model calls go to)``."""
    if kind == "gateway":
        status, body = await pools.post(url, "/sessions", {"task": {}, "sampling": {"max_tokens": 16}}, ADMIN_KEY)
        info = json.loads(body)
        return info["id"], info["api_key"], info["base_url"]
    if kind == "peer":
        status, body = await pools.post(url, "/sessions", {"metadata": {"task": "benchmark"}})
        return json.loads(body)["session_id"], None, url
    return None, None, url


async def _close(kind: str, url: str, sid: str, pools: Pools) -> None:
    """Collect what the gateway recorded: agentgym's finish returns the trajectories; the peer's
    traces are read with ``GET /sessions/<id>/traces``."""
    if kind == "gateway":
        status, body = await pools.post(url, f"/sessions/{sid}/finish", {}, ADMIN_KEY)
    else:
        status, body = await pools.post(url, f"/sessions/{sid}/traces", None, method="GET")
    if status != 200:
        raise RuntimeError(f"{kind}: collecting session {sid} failed ({status}): {body[:300]!r}")


async def _worker(
    kind: str, url: str, seconds: float, warmup: float, latencies: list[float], admin: list[float], pools: Pools
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + warmup + seconds
    while loop.time() < end:
        t = time.perf_counter()
        sid, key, call_url = await _open(kind, url, pools)
        if sid:
            admin.append(time.perf_counter() - t)
        for turn in range(TURNS):
            payload = {"model": "m", "messages": _messages(turn), "max_tokens": 16}
            path = f"/sessions/{sid}/v1/chat/completions" if sid else "/v1/chat/completions"
            t = time.perf_counter()
            status, body = await pools.post(call_url, path, payload, key)
            if status != 200:
                raise RuntimeError(f"{kind} call failed ({status}): {body[:300]!r}")
            if loop.time() - start > warmup and loop.time() < end:
                latencies.append(time.perf_counter() - t)
        if sid:
            t = time.perf_counter()
            await _close(kind, url, sid, pools)
            admin.append(time.perf_counter() - t)


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU time a process (and its live children) used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    listing = Path(f"/proc/{pid}/task/{pid}/children")
    kids = listing.read_text().split() if children and listing.exists() else []
    return own + sum(cpu_seconds(int(k)) for k in kids)


async def measure(
    kind: str, url: str, concurrency: int, seconds: float, warmup: float, pids: dict[str, int]
) -> dict[str, float]:
    """Closed loop: ``concurrency`` workers call as fast as answers come. CPU per call of this load
    generator (``client``) and of each process in ``pids`` is read over the whole run (warm-up
    included) and divided by the calls made."""
    latencies: list[float] = []
    admin: list[float] = []
    before = {name: cpu_seconds(pid, name != "client") for name, pid in {"client": os.getpid(), **pids}.items()}
    started = time.perf_counter()
    pools = Pools(concurrency)
    try:
        await asyncio.gather(
            *(_worker(kind, url, seconds, warmup, latencies, admin, pools) for _ in range(concurrency))
        )
    finally:
        await pools.aclose()
    ms = sorted(x * 1e3 for x in latencies)
    out = {
        "calls_per_s": len(ms) / seconds,
        "p50_ms": ms[len(ms) // 2],
        "p99_ms": ms[int(len(ms) * 0.99)],
        "calls": float(len(ms)),
        "admin_calls": float(len(admin)),
    }
    total_calls = len(ms) * (time.perf_counter() - started) / seconds  # calls made in the whole run, roughly
    for name, cpu in before.items():
        pid = os.getpid() if name == "client" else pids[name]
        out[f"{name}_cpu_ms_per_call"] = (cpu_seconds(pid, name != "client") - cpu) / max(total_calls, 1.0) * 1e3
    return out


def run_benchmark(concurrency: int, seconds: float, warmup: float, delay_ms: float, workers: int = 1) -> None:
    gateway_port = free_port()
    standin = start_standin(0, mode="fixed", delay_ms=delay_ms)
    gateway = None
    try:
        gateway = start_gateway_process(gateway_port, [standin.url], workers=workers)
        direct_url, gateway_url = standin.url, f"http://127.0.0.1:{gateway_port}"
        rows = []
        for label, c, secs in (
            (f"{concurrency} concurrent sessions", concurrency, seconds),
            ("1 at a time (unloaded)", 1, max(3.0, seconds / 4)),
        ):
            direct = asyncio.run(measure("direct", direct_url, c, secs, warmup, {"standin": standin.pid}))
            through = asyncio.run(
                measure("gateway", gateway_url, c, secs, warmup, {"gateway": gateway.pid, "standin": standin.pid})
            )
            rows.append((label, direct, through))
    finally:
        if gateway is not None:
            stop(gateway)
        stop(standin)

    print(
        f"\ngateway vs direct: stand-in answers {'instantly' if not delay_ms else f'after {delay_ms:.0f} ms'}; "
        f"{TURNS}-turn chats re-sending their history; the same load generator on both paths; "
        f"gateway: {workers} process{'es' if workers > 1 else ''}; "
        f"{os.cpu_count()} CPU(s) shared by client, gateway, stand-in; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'load':<28} {'path':<8} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'CPU ms/call: client':>20} {'gateway':>8} {'stand-in':>9}"
    )
    for label, direct, through in rows:
        for name, r in (("direct", direct), ("gateway", through)):
            cpu = f"{r['gateway_cpu_ms_per_call']:.2f}" if "gateway_cpu_ms_per_call" in r else "-"
            print(
                f"{label:<28} {name:<8} {r['calls_per_s']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                f"{r['client_cpu_ms_per_call']:>20.3f} {cpu:>8} {r['standin_cpu_ms_per_call']:>9.3f}"
            )
        print(
            f"{'':<28} {'ratio':<8} {through['calls_per_s'] / direct['calls_per_s']:>9.2f} "
            f"{'+' + format(through['p50_ms'] - direct['p50_ms'], '.2f'):>8} "
            f"{'+' + format(through['p99_ms'] - direct['p99_ms'], '.2f'):>8}   (gateway minus direct)"
        )
    print(
        f"(gateway rows also made one session create + finish per {TURNS} calls: not counted in calls/s, but their "
        "CPU is in the per-call CPU. CPU-bound ceiling of a path: CPUs / its total CPU ms per call.)"
    )
    direct, through = rows[0][1], rows[0][2]
    if not delay_ms:
        cpus = os.cpu_count() or 1
        budget = (
            cpus / (0.8 * direct["calls_per_s"]) * 1e3
            - through["client_cpu_ms_per_call"]
            - through["standin_cpu_ms_per_call"]
        )
        verdict = (
            ""
            if budget > 0
            else ": the client and stand-in alone spend more on the gateway path, so not even a "
            "gateway that cost nothing could reach 0.8x on this machine"
        )
        print(
            f"0.8x of direct ({0.8 * direct['calls_per_s']:.0f} calls/s) on {cpus} CPU(s) leaves the gateway "
            f"{budget * 1e3:.0f} us of CPU per call; it spends {through['gateway_cpu_ms_per_call'] * 1e3:.0f} "
            f"us{verdict}."
        )


def run_versus_peer(
    concurrencies: list[int],
    seconds: float,
    warmup: float,
    delay_ms: float,
    python: str = PEER_PYTHON,
    peer_store: str = "sqlite",
) -> list[tuple[int, dict[str, dict[str, float]]]]:
    """agentgym's gateway (finished sessions in memory, and in SQLite) and ``rllm-model-gateway`` (its
    default SQLite trace store) in one run, in front of the same stand-in, at each concurrency (that
    many 4-turn sessions at once), with direct calls to the stand-in as the baseline for the added
    latency. Prints the table; returns the figures."""
    import tempfile

    standin = start_standin(0, mode="fixed", delay_ms=delay_ms)
    procs: dict[str, subprocess.Popen] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="peer-gateway-") as tmp:
        try:
            ports = {kind: free_port() for kind in PATHS[1:]}
            procs["gateway"] = start_gateway_process(ports["gateway"], [standin.url])
            procs["gateway-sqlite"] = start_gateway_process(
                ports["gateway-sqlite"], [standin.url], extra=["--store", f"sqlite:{tmp}/agentgym.sqlite"]
            )
            procs["peer"] = start_peer_process(
                ports["peer"], standin.url, str(Path(tmp) / "traces.db"), python, store=peer_store
            )
            urls = {"direct": standin.url, **{kind: f"http://127.0.0.1:{port}" for kind, port in ports.items()}}
            for c in concurrencies:
                figures = {}
                for kind in PATHS:
                    pids = {"gateway": procs[kind].pid} if kind in procs else {}
                    figures[kind] = asyncio.run(
                        measure(kind.split("-")[0], urls[kind], c, seconds, warmup, {**pids, "standin": standin.pid})
                    )
                rows.append((c, figures))
        finally:
            for proc in procs.values():
                stop(proc)
            stop(standin)

    print(
        f"\nagentgym gateway vs {PEER} 0.1.0, each in front of the same stand-in "
        f"({'instant' if not delay_ms else f'{delay_ms:.0f} ms per generation'}); {TURNS}-turn sessions "
        f"re-sending their history, each created and collected (agentgym: finish -> trajectories; peer: GET "
        f"traces); {seconds:.0f} s per row; {os.cpu_count()} CPU(s) shared by client, gateways and stand-in; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'sessions':>8} {'path':<26} {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>8} {'added p50':>10} "
        f"{'added p99':>10} {'gateway CPU ms/call':>20}"
    )
    for c, figures in rows:
        direct = figures["direct"]
        for kind in PATHS:
            r = figures[kind]
            added = (
                ("-", "-")
                if kind == "direct"
                else (f"+{r['p50_ms'] - direct['p50_ms']:.2f}", f"+{r['p99_ms'] - direct['p99_ms']:.2f}")
            )
            cpu = f"{r['gateway_cpu_ms_per_call']:.3f}" if kind != "direct" else "-"
            name = PATH_NAMES[kind].replace("(sqlite)", f"({peer_store})") if kind == "peer" else PATH_NAMES[kind]
            print(
                f"{c:>8} {name:<26} {r['calls_per_s']:>8.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>8.2f} "
                f"{added[0]:>10} {added[1]:>10} {cpu:>20}"
            )
        for kind in ("gateway", "gateway-sqlite"):
            ratio = figures[kind]["calls_per_s"] / max(figures["peer"]["calls_per_s"], 1e-9)
            cpu_ratio = figures["peer"]["gateway_cpu_ms_per_call"] / max(figures[kind]["gateway_cpu_ms_per_call"], 1e-9)
            print(
                f"{'':>8} {PATH_NAMES[kind] + ' / peer':<26} {ratio:>7.1f}x calls/s; the peer spends "
                f"{cpu_ratio:.1f}x its CPU per call"
            )
    print(
        "(a gateway's CPU per call includes its share of session create + collect, one each per "
        f"{TURNS} calls; added latency: that path's minus direct's at the same concurrency)"
    )
    return rows


PATHS = ("direct", "gateway", "gateway-sqlite", "peer")
PATH_NAMES = {
    "direct": "direct (no gateway)",
    "gateway": "agentgym (memory)",
    "gateway-sqlite": "agentgym (--store sqlite)",
    "peer": f"{PEER} (sqlite)",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--concurrency",
        type=str,
        default=None,
        help="concurrent sessions; a comma list with --peer (default: 256; with --peer 1,64,256)",
    )
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per side (default 20; --peer 8)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="stand-in latency per generation (0: instant)")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes (agentgym gateway --workers)")
    parser.add_argument(
        "--peer",
        choices=[PEER],
        default=None,
        help=f"measure against this peer gateway in the same run (its Python: $AGENTGYM_PEER_PYTHON, "
        f"default {PEER_PYTHON})",
    )
    parser.add_argument(
        "--peer-store",
        choices=["sqlite", "memory"],
        default="sqlite",
        help="the peer's trace store (its default: sqlite)",
    )
    args = parser.parse_args(argv)
    if args.peer:
        concurrencies = [int(c) for c in (args.concurrency or "1,64,256").split(",")]
        run_versus_peer(concurrencies, args.seconds or 8.0, args.warmup, args.delay_ms, peer_store=args.peer_store)
        return 0
    run_benchmark(int(args.concurrency or 256), args.seconds or 20.0, args.warmup, args.delay_ms, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
