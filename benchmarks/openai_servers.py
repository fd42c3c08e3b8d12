"""OpenAI-compatible policy servers side by side: the embedded server against vLLM (or any other).

    # start both servers here on SmolLM2-135M (vLLM from the venv $AGENTGYM_VLLM_PYTHON names)
    AGENTGYM_VLLM_PYTHON=/work/vllm-venv/bin/python \\
        .venv/bin/python benchmarks/openai_servers.py --model smollm2-135m --start embedded --start vllm
    # servers already running: NAME=URL (their CPU time is read from the process listening on the port,
    # or from --pid NAME=PID)
    .venv/bin/python benchmarks/openai_servers.py --model smollm2-135m \\
        --server embedded=http://127.0.0.1:8000 --server vllm=http://127.0.0.1:8001
    ... --quick       # 2 repeats; rollouts of at most 4 turns of 64 tokens

Every server gets the same chat requests (``/v1/chat/completions``: the same messages, rendered by each
server with the model directory's own chat template, so the prompt tokens are the same; ``max_tokens``
= ``min_tokens`` = 128 with ``ignore_eos``, so every request runs to length; greedy, no ``seed``), the
servers taking turns within every repeat (the order rotates), and each cell is the median of the repeats:

* generated tokens/s with 1, 8 and 32 concurrent requests (usage.completion_tokens / wall time);
* time to first token: one streamed request (16 new tokens) at a time, until the first chunk with text;
* server CPU seconds per 1,000 generated tokens at each concurrency: user + system time of the server's
  process tree (the process listening on the server's port, or ``--pid``, and all its descendants:
  vLLM's engine core runs in a child process), so the figure moves less with other load;
* Sokoban rollout turns/s: ``agentgym rollout --env sokoban -n 32 --tasks 1 --server URL`` in a child
  process (its own ``throughput/turns_per_s``: turns over the rollout's wall time, start-up excluded).

and the ratio embedded / other for every other server (for tok/s and turns/s above 1 is the embedded
server faster; for time to first token and CPU per token below 1 is it cheaper). Load averages
are printed before and after: on a shared machine wall-clock cells move with the load, CPU seconds
much less. Servers started here (``--start``) run float32 (``--dtype float32`` for vLLM, which would
otherwise run bfloat16 on a CPU); a server given by URL is the caller's to start in float32. ``--start vllm``
goes through agentgym's launcher, which on a CPU turns chunked prefill off (docs/vllm_cpu.md;
``--vllm-arg=--enable-chunked-prefill`` restores vLLM's default); its log is ``vllm.log`` in ``--log-dir``.
``benchmarks/server.py`` measures the embedded server alone (token-id prompts, weight pushes).
Installing vLLM's CPU build beside the project: docs/vllm_cpu.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentgym.model import resolve_model_path  # noqa: E402

CONCURRENCY = (1, 8, 32)
TTFT_TOKENS = 16  # the streamed request that times the first token needs no more
TOPICS = (
    "a lighthouse keeper",
    "a lost umbrella",
    "the first day of spring",
    "a robot learning to paint",
    "a river that flows uphill",
    "an old map",
    "a city under snow",
    "a dragon who is afraid of heights",
    "a library at midnight",
    "the last train home",
    "a garden on the moon",
    "a clock that runs backwards",
    "a baker's secret recipe",
    "a message in a bottle",
    "a cat who runs a hotel",
    "a forgotten song",
    "two rival chess players",
    "a storm at sea",
    "a village without names",
    "a mountain that moves",
    "the smallest kingdom",
    "a letter never sent",
    "a market in the desert",
    "a child's kite",
    "an island of glass",
    "a detective who cannot see",
    "a tree older than the town",
    "a bridge built overnight",
    "a violin in the attic",
    "the night the stars went out",
    "a penguin in the tropics",
    "a door that opens once a year",
)
SYSTEM = "You are a helpful assistant who writes vivid, detailed prose."


def messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."},
    ]


@dataclass
class Server:
    name: str
    url: str
    pid: int | None = None
    handle: Any = None  # a server this script started
    model: str = ""  # its served model name
    backend: str = "vllm"  # agentgym rollout --backend
    cells: dict[str, list[float]] = field(default_factory=dict)
    prompt_tokens: int = 0
    greedy_text: str = ""

    def add(self, cell: str, value: float) -> None:
        self.cells.setdefault(cell, []).append(value)

    def median(self, cell: str) -> float | None:
        values = self.cells.get(cell)
        return statistics.median(values) if values else None


# ---- the server's process tree and its CPU time --------------------------------------------------------
def listening_pid(url: str) -> int | None:
    """The process listening on ``url``'s port (None when it cannot be seen, e.g. another user's)."""
    port = urlparse(url).port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def tree_cpu(pid: int | None) -> dict[int, float]:
    """User + system CPU seconds of ``pid`` and each of its descendants, by pid."""
    if pid is None:
        return {}
    out: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for proc in processes:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[proc.pid] = times.user + times.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


# ---- requests -------------------------------------------------------------------------------------------
def chat_body(server: Server, i: int, new_tokens: int, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": server.model,
        "messages": messages(i),
        "max_tokens": new_tokens,
        "min_tokens": new_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    if stream:
        body["stream"] = True
    return body


async def one_chat(client: httpx.AsyncClient, server: Server, i: int, new_tokens: int) -> dict[str, Any]:
    r = await client.post(f"{server.url}/v1/chat/completions", json=chat_body(server, i, new_tokens))
    if r.status_code != 200:
        raise RuntimeError(f"{server.name} ({server.url}) answered {r.status_code}: {r.text[:500]}")
    body = r.json()
    got = body["usage"]["completion_tokens"]
    if got != new_tokens:
        raise RuntimeError(
            f"{server.name} generated {got} tokens, not {new_tokens}: it ignored min_tokens / ignore_eos "
            "(the rates would not compare)"
        )
    return body


async def batch(client: httpx.AsyncClient, server: Server, concurrency: int, new_tokens: int) -> tuple[float, float]:
    """``(tokens/s, server CPU seconds)`` of ``concurrency`` concurrent chat requests."""
    before = tree_cpu(server.pid)
    start = time.perf_counter()
    bodies = await asyncio.gather(*(one_chat(client, server, i, new_tokens) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    cpu = cpu_delta(before, tree_cpu(server.pid))
    if concurrency == 1 and not server.greedy_text:
        server.prompt_tokens = bodies[0]["usage"]["prompt_tokens"]
        server.greedy_text = bodies[0]["choices"][0]["message"]["content"] or ""
    return sum(b["usage"]["completion_tokens"] for b in bodies) / elapsed, cpu


async def first_token(client: httpx.AsyncClient, server: Server, new_tokens: int) -> float:
    """Seconds from sending one streamed chat request to its first chunk that carries text."""
    start = time.perf_counter()
    async with client.stream(
        "POST", f"{server.url}/v1/chat/completions", json=chat_body(server, 0, new_tokens, stream=True)
    ) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{server.name} answered {r.status_code} to a streamed request: {await r.aread()}")
        ttft = None
        async for line in r.aiter_lines():
            if ttft is not None or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError(f"{server.name} streamed no text")
    return ttft


# ---- the rollout cell -------------------------------------------------------------------------------------
def rollout(server: Server, args: argparse.Namespace, log_dir: Path) -> float:
    """``throughput/turns_per_s`` of ``agentgym rollout --env sokoban -n EPISODES --tasks 1 --server URL``."""
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "rollout",
        "--env",
        "sokoban",
        "-n",
        str(args.episodes),
        "--tasks",
        "1",
        "--concurrency",
        str(args.episodes),
        "--server",
        server.url,
        "--backend",
        server.backend,
        "--model",
        args.model,
    ]
    if args.max_turns:
        command += ["--max-turns", str(args.max_turns)]
    if args.rollout_max_tokens:
        command += ["--max-tokens", str(args.rollout_max_tokens)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    (log_dir / f"rollout-{server.name}.log").write_text(done.stdout + done.stderr)
    match = re.search(r"^throughput/turns_per_s\s+([\d.]+)", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(
            f"agentgym rollout against {server.name} failed (exit {done.returncode}):\n"
            f"{' '.join(command)}\n{(done.stdout + done.stderr)[-2000:]}"
        )
    return float(match.group(1))


# ---- servers --------------------------------------------------------------------------------------------------
def parse_server(spec: str) -> Server:
    name, _, url = spec.rpartition("=") if "=" in spec.split("://")[0] else ("", "", spec)
    url = url.rstrip("/").removesuffix("/v1")
    return Server(name=name or (urlparse(url).netloc), url=url)


def start(kind: str, model: str, args: argparse.Namespace, log_dir: Path) -> Server:
    started = time.perf_counter()
    print(f"starting {kind} on {model} ...", file=sys.stderr, flush=True)
    if kind == "embedded":
        from agentgym.server.launch import start_embedded_server

        handle = start_embedded_server(
            model,
            in_process=False,
            dtype="float32",
            max_batch_size=32,
            timeout=600,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        )
    else:
        import torch

        from agentgym.server.launchers import start_engine_server

        handle = start_engine_server(
            "vllm",
            model,
            dtype="float32",
            # on vLLM's CPU backend this is the share of the machine's memory it takes for its KV cache
            gpu_memory_utilization=0.85 if torch.cuda.is_available() else args.vllm_memory,
            extra_args=args.vllm_arg or (),
            kv_cache_memory_bytes=args.kv_cache_memory_bytes,  # when given it overrides the share above
            log_path=log_dir / "vllm.log",
            timeout=1200,
            python=args.vllm_python,
        )
    print(f"{kind} ready at {handle.url} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return Server(name=kind, url=handle.url, pid=handle.process.pid, handle=handle, backend=kind)


async def identify(client: httpx.AsyncClient, server: Server) -> None:
    """The served model name and the rollout backend from ``/v1/models`` (agentgym's says ``agentgym``)."""
    r = await client.get(f"{server.url}/v1/models")
    r.raise_for_status()
    card = r.json()["data"][0]
    server.model = card["id"]
    if server.handle is None:
        server.backend = "embedded" if card.get("owned_by") == "agentgym" else "vllm"
        server.pid = server.pid or listening_pid(server.url)
    if server.pid is None:
        print(
            f"warning: no process listening on {server.url} is visible here; pass --pid {server.name}=PID "
            "for its CPU seconds",
            file=sys.stderr,
        )


# ---- the run ---------------------------------------------------------------------------------------------------
def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def measure(servers: list[Server], args: argparse.Namespace, log_dir: Path) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        for s in servers:
            await identify(client, s)
        print("warming up ...", file=sys.stderr, flush=True)
        for s in servers:
            for c in CONCURRENCY:
                await batch(client, s, c, 8)
            await first_token(client, s, 8)
        for rep in range(args.repeats):
            order = servers[rep % len(servers) :] + servers[: rep % len(servers)]
            for c in CONCURRENCY:
                for s in order:
                    rate, cpu = await batch(client, s, c, args.new_tokens)
                    s.add(f"tok/s {c}", rate)
                    s.add(f"cpu {c}", cpu / (c * args.new_tokens / 1000))
                    print(
                        f"  [{time.strftime('%H:%M:%S')}] repeat {rep + 1}: {s.name} {c} concurrent: {rate:.1f} tok/s, "
                        f"{cpu:.1f} CPU s (load {loadavg()})",
                        file=sys.stderr,
                        flush=True,
                    )
            for s in order:
                s.add("ttft", await first_token(client, s, TTFT_TOKENS))
                print(f"  repeat {rep + 1}: {s.name} first token {s.cells['ttft'][-1] * 1000:.0f} ms", file=sys.stderr)
    for rep in range(args.rollout_repeats):
        order = servers[rep % len(servers) :] + servers[: rep % len(servers)]
        for s in order:
            try:
                rate = await asyncio.to_thread(rollout, s, args, log_dir)
            except RuntimeError as exc:  # the other cells still print
                print(f"  rollout against {s.name} failed: {exc}", file=sys.stderr, flush=True)
                continue
            s.add("turns/s", rate)
            print(
                f"  [{time.strftime('%H:%M:%S')}] rollout {rep + 1}: {s.name} {rate:.2f} turns/s (load {loadavg()})",
                file=sys.stderr,
                flush=True,
            )


ROWS = [
    *((f"tok/s, {c} concurrent, {{n}} new tokens", f"tok/s {c}", "{:.1f}") for c in CONCURRENCY),
    ("time to first token, 1 concurrent (ms)", "ttft", "{:.0f}"),
    ("Sokoban rollout turns/s (-n {e}, 1 task, all at once)", "turns/s", "{:.2f}"),
    *((f"server CPU s per 1k tokens, {c} concurrent", f"cpu {c}", "{:.2f}") for c in CONCURRENCY),
]


def table(servers: list[Server], args: argparse.Namespace) -> str:
    base = next((s for s in servers if s.name == "embedded"), servers[0])
    others = [s for s in servers if s is not base]
    head = ["cell", *(s.name for s in servers), *(f"{base.name} / {s.name}" for s in others)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for label, cell, fmt in ROWS:
        values = [s.median(cell) for s in servers]
        if all(v is None for v in values):
            continue
        if cell == "ttft":
            values = [v * 1000 if v is not None else None for v in values]
        row = [label.format(n=args.new_tokens, e=args.episodes)]
        row += [fmt.format(v) if v is not None else "-" for v in values]
        mine = values[servers.index(base)]
        for s in others:
            theirs = values[servers.index(s)]
            row.append(f"{mine / theirs:.2f}x" if mine is not None and theirs else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="model name or directory (%(default)s)")
    parser.add_argument("--server", action="append", default=[], metavar="[NAME=]URL", help="a running server")
    parser.add_argument("--pid", action="append", default=[], metavar="NAME=PID", help="a --server's process")
    parser.add_argument(
        "--start", action="append", default=[], choices=["embedded", "vllm"], help="start this server here"
    )
    parser.add_argument("--vllm-python", default=None, help="the Python that has vLLM ($AGENTGYM_VLLM_PYTHON)")
    parser.add_argument("--vllm-memory", type=float, default=0.15, help="CPU: share of memory for vLLM's KV cache")
    parser.add_argument(
        "--kv-cache-memory-bytes",
        default=None,
        metavar="SIZE",
        help="KV cache memory for every server started here (4G, ...; default: each server's own)",
    )
    parser.add_argument("--vllm-arg", action="append", metavar="ARG", help="an extra flag for vLLM (repeatable)")
    parser.add_argument("--quick", action="store_true", help="2 repeats; rollouts of 4 turns of 64 tokens at most")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (5; --quick 2)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--episodes", type=int, default=32, help="rollout -n (%(default)s)")
    parser.add_argument("--max-turns", type=int, default=None, help="rollout --max-turns (the env's; --quick 4)")
    parser.add_argument(
        "--rollout-max-tokens", type=int, default=None, help="rollout --max-tokens per turn (256; --quick 64)"
    )
    parser.add_argument("--rollout-repeats", type=int, default=None, help="rollouts per server (2; --quick 1)")
    parser.add_argument("--log-dir", default=None, help="rollout and vLLM logs (a temporary directory)")
    args = parser.parse_args()
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.rollout_repeats = args.rollout_repeats if args.rollout_repeats is not None else (1 if args.quick else 2)
    args.max_turns = args.max_turns or (4 if args.quick else None)
    args.rollout_max_tokens = args.rollout_max_tokens or (64 if args.quick else None)
    if not args.server and not args.start:
        parser.error("nothing to measure: give --server URL and/or --start embedded|vllm")
    import tempfile

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="agentgym-openai-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    model = str(resolve_model_path(args.model))
    args.model = model
    servers = [parse_server(spec) for spec in args.server]
    pids = dict(p.split("=", 1) for p in args.pid)
    for s in servers:
        if s.name in pids:
            s.pid = int(pids[s.name])
    began, load_before = time.perf_counter(), loadavg()
    try:
        servers += [start(kind, model, args, log_dir) for kind in args.start]
        measured = time.perf_counter()
        try:
            asyncio.run(measure(servers, args, log_dir))
        except (RuntimeError, httpx.HTTPError) as exc:  # a server died: print what was measured before it
            print(f"stopped early: {type(exc).__name__}: {exc}", file=sys.stderr)
        load_after = loadavg()
    finally:
        for s in servers:
            if s.handle is not None:
                s.handle.stop()
    print(
        f"\n## OpenAI servers side by side: {Path(model).name}, {args.new_tokens} new tokens per request, greedy, "
        f"medians of {args.repeats} interleaved repeats ({args.rollout_repeats} for the rollout"
        f"{f', at most {args.max_turns} turns' if args.max_turns else ''}"
        f"{f' of at most {args.rollout_max_tokens} tokens' if args.rollout_max_tokens else ''})"
        f"{f', KV cache {args.kv_cache_memory_bytes} each' if args.kv_cache_memory_bytes else ''}\n"
    )
    print(table(servers, args))
    print(
        f"\nload average (1/5/15 min) before {load_before}, after {load_after}; {os.cpu_count()} CPUs; "
        f"measuring took {time.perf_counter() - measured:.0f} s ({time.perf_counter() - began:.0f} s with start-up); "
        f"logs in {log_dir}"
    )
    tokens = {s.name: s.prompt_tokens for s in servers}
    print(f"prompt tokens of request 0: {tokens}" + ("" if len(set(tokens.values())) == 1 else "  <- DIFFERENT"))
    texts = [s.greedy_text for s in servers]
    same = next((i for i, chars in enumerate(zip(*texts)) if len(set(chars)) > 1), min(map(len, texts), default=0))
    print(
        "greedy replies to request 0: identical"
        if len(set(texts)) == 1
        else f"greedy replies to request 0 agree on their first {same} characters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
