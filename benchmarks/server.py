"""Embedded policy server: generation throughput and weight-push time.

This targets agentgym's embedded server only (it sends token-id prompts and reads the ``token_ids``
field that server returns; it compares with ``model.generate``). To compare the embedded server with
vLLM or any other OpenAI-compatible server on the same chat requests, use
``benchmarks/openai_servers.py`` (docs/vllm_cpu.md).

    .venv/bin/python benchmarks/server.py            # tiny throughput + tiny and Qwen2.5-0.5B-shaped pushes
    .venv/bin/python benchmarks/server.py --quick    # fewer tokens and repeats

1. Generated tokens/s with 1, 8 and 32 concurrent ``/v1/completions`` requests (token-id
   prompts, ``ignore_eos``, the server in its own process, called over HTTP by a lean load
   generator) against one in-process ``model.generate`` on the same batch. Target: at 32,
   server >= 0.8x generate.
2. Time to push a state dict into a running server in another process (``handle.update_weights``:
   one safetensors file in /dev/shm + ``/update_weights_from_disk``), the same tensors as an
   HTTP body (``/update_weights_from_tensor``), and into a server in this process (a straight
   copy), against ``torch.save`` + ``torch.load`` of the same state dict in the same directory.
   Target: push <= 1.5x save+load.

Every figure is the best of a few interleaved runs: on a shared machine the minimum is the
least noisy estimate of what the code costs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym.model import load_causal_lm, resolve_model_path  # noqa: E402
from agentgym.model.weights import push_dir  # noqa: E402
from agentgym.server.launch import start_embedded_server  # noqa: E402


def generate_run(model, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """``(tokens/s, CPU seconds)`` of one ``model.generate`` on the whole batch."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # every sequence runs to new_tokens, like ignore_eos on the server
    config.update(do_sample=True, top_k=0, top_p=1.0, max_new_tokens=new_tokens, pad_token_id=0)
    cpu, start = time.process_time(), time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=config)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return (out.shape[1] - prompts.shape[1]) * prompts.shape[0] / elapsed, cpu


async def server_tok_s(url: str, prompts: torch.Tensor, new_tokens: int) -> float:
    """Tokens/s of ``len(prompts)`` concurrent ``/v1/completions`` requests.

    The load generator is deliberately lean (pre-opened keep-alive connections, request bytes
    built before the clock starts) so the figure is the server's, not an HTTP client library's:
    httpx spends about a millisecond of CPU per request, which alone spreads 32 requests over
    ~30 ms on this machine.
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    requests = []
    for ids in prompts.tolist():
        body = json.dumps(
            {"prompt": ids, "max_tokens": new_tokens, "temperature": 1.0, "logprobs": 0, "ignore_eos": True}
        ).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        requests.append(head + body)
    connections = [await asyncio.open_connection(host, int(port)) for _ in requests]

    async def one(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> int:
        reader, writer = connection
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"content-length: *(\d+)", head, re.IGNORECASE).group(1))
        body = json.loads(await reader.readexactly(length))
        if status != 200:
            raise RuntimeError(f"{url} answered {status}: {body}")
        return len(body["choices"][0]["token_ids"])

    try:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(c, r) for c, r in zip(connections, requests)))
        elapsed = time.perf_counter() - start
    finally:
        for _, writer in connections:
            writer.close()
    assert all(c == new_tokens for c in counts)
    return sum(counts) / elapsed


def server_run(server, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """``(tokens/s, CPU seconds of server and client processes)`` of concurrent requests."""
    proc = psutil.Process(server.process.pid)
    before = sum(proc.cpu_times()[:2]), time.process_time()
    rate = asyncio.run(server_tok_s(server.url, prompts, new_tokens))
    return rate, sum(proc.cpu_times()[:2]) - before[0] + time.process_time() - before[1]


def throughput(quick: bool) -> None:
    new_tokens, prompt_len, repeats = (64, 32, 5) if quick else (128, 32, 7)
    model = load_causal_lm("tiny")
    server = start_embedded_server("tiny", in_process=False, max_batch_size=32)
    print(
        f"\n## generation throughput: tiny model, CPU fp32, prompts of {prompt_len} tokens, "
        f"{new_tokens} new tokens each (best of {repeats}, interleaved)\n"
    )
    print(
        "Wall-clock rates swing with whatever else runs on the machine; CPU seconds per 1,000 "
        "generated tokens (server + client processes vs the generate process) measure the cost "
        "itself.\n"
    )
    print(
        "| concurrent | generate tok/s | server tok/s | ratio | generate CPU s/1k tok | "
        "server+client CPU s/1k tok | CPU ratio |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        gen = torch.Generator().manual_seed(0)
        for concurrency in (1, 8, 32):
            prompts = torch.randint(10, 600, (concurrency, prompt_len), generator=gen)
            generate_run(model, prompts, 8)  # warm-up
            server_run(server, prompts, 8)
            base = served = 0.0
            base_cpu = served_cpu = float("inf")
            tokens = concurrency * new_tokens / 1000
            for _ in range(repeats):  # interleaved, so both see the same background load
                rate, cpu = generate_run(model, prompts, new_tokens)
                base, base_cpu = max(base, rate), min(base_cpu, cpu / tokens)
                rate, cpu = server_run(server, prompts, new_tokens)
                served, served_cpu = max(served, rate), min(served_cpu, cpu / tokens)
            print(
                f"| {concurrency} | {base:,.0f} | {served:,.0f} | {served / base:.2f}x | {base_cpu:.3f} | "
                f"{served_cpu:.3f} | {base_cpu / served_cpu:.2f}x |",
                flush=True,
            )
    finally:
        server.stop()


def qwen05_shaped_dir() -> Path:
    """A Qwen2.5-0.5B-shaped model with random weights and the tiny tokenizer, built once."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    target = Path(tempfile.gettempdir()) / "agentgym-bench-qwen05-random"
    if (target / "config.json").exists():
        return target
    print("building a Qwen2.5-0.5B-shaped random model (once; ~2 GB) ...", flush=True)
    config = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        eos_token_id=151645,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    staging = target.with_name(target.name + ".tmp")
    model.save_pretrained(staging)
    tiny = Path(resolve_model_path("tiny"))
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (staging / f.name).write_bytes(f.read_bytes())
    staging.rename(target)
    return target


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def push_times(name: str, model_dir: str, repeats: int, body: bool) -> None:
    from safetensors.torch import save as safetensors_bytes

    state = {k: v + 0.01 for k, v in load_causal_lm(model_dir).state_dict().items() if k != "lm_head.weight"}
    size_gb = sum(v.numel() * v.element_size() for v in state.values()) / 1e9
    log(f"{name}: starting a server")
    server = start_embedded_server(model_dir, in_process=False, timeout=600)
    path = push_dir() / f"agentgym-bench-{os.getpid()}.pt"
    best = {"save+load": float("inf"), "push": float("inf"), "body": float("inf")}
    try:
        for version in range(1, repeats + 1):
            start = time.perf_counter()
            torch.save(state, path)
            loaded = torch.load(path, weights_only=True)
            best["save+load"] = min(best["save+load"], time.perf_counter() - start)
            del loaded
            path.unlink()
            log(f"{name}: torch.save + torch.load {time.perf_counter() - start:.2f} s")
            start = time.perf_counter()
            server.update_weights(state, version)
            best["push"] = min(best["push"], time.perf_counter() - start)
            log(f"{name}: update_weights {time.perf_counter() - start:.2f} s")
            if body:
                start = time.perf_counter()
                r = httpx.post(
                    server.url + f"/update_weights_from_tensor?weight_version={version + 100}",
                    content=safetensors_bytes(state),
                    timeout=600,
                    headers={"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/octet-stream"},
                )
                r.raise_for_status()
                best["body"] = min(best["body"], time.perf_counter() - start)
                log(f"{name}: HTTP body {time.perf_counter() - start:.2f} s")
    finally:
        path.unlink(missing_ok=True)
        server.stop()
    log(f"{name}: an in-process server")
    server = start_embedded_server(model_dir)  # same process: the state dict is copied straight in
    best["direct"] = float("inf")
    try:
        for version in range(1, repeats + 1):
            start = time.perf_counter()
            server.update_weights(state, version)
            best["direct"] = min(best["direct"], time.perf_counter() - start)
    finally:
        server.stop()
    base = best["save+load"]

    def cell(key: str) -> str:
        return f"{best[key]:.3f} ({best[key] / base:.2f}x)" if best[key] < float("inf") else "-"

    print(
        f"| {name} ({size_gb:.2f} GB) | {base:.3f} | {cell('push')} | {cell('body')} | {cell('direct')} |", flush=True
    )


def weights(quick: bool, body_for_large: bool) -> None:
    repeats = 2 if quick else 3
    print(
        f"\n## weight push into a running server (separate process), fp32, best of {repeats}; files in {push_dir()}\n"
    )
    print(
        "| model | torch.save + torch.load (s) | update_weights via /dev/shm safetensors (s) | "
        "safetensors HTTP body (s) | in-process handle (s) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    push_times("tiny", "tiny", repeats * 3, body=True)
    push_times("Qwen2.5-0.5B shape", str(qwen05_shaped_dir()), repeats, body=body_for_large)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--only", choices=["throughput", "weights"], help="run one part")
    parser.add_argument(
        "--http-body-large",
        action="store_true",
        help="also time the 0.5B model as an HTTP body (slow: several copies of 2 GB)",
    )
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    if args.only != "weights":
        throughput(args.quick)
    if args.only != "throughput":
        weights(args.quick, args.http_body_large)


if __name__ == "__main__":
    main()
