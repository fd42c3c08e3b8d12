"""The embedded engine against Hugging Face ``generate``, and the prefix cache on a multi-turn rollout.

    python benchmarks/engine.py                  # tiny + mid-size on CPU (+ 0.5B shape on a GPU), Sokoban
    python benchmarks/engine.py --quick          # fewer tokens and repeats
    python benchmarks/engine.py --only sokoban   # just the prefix-cache rollout

1. **Throughput.** ``c`` concurrent requests (random token-id prompts of ``--prompt-len``,
   ``--new-tokens`` sampled tokens each at temperature 1, eos ignored) submitted at once to
   an ``Engine`` in this process, against one ``model.generate`` on the same ``c`` prompts
   (static batch, the same sampling, same number of tokens), at c = 1 / 8 / 32 / 128. The
   two alternate ``--repeats`` times in the same process on the same model; the table shows
   median tokens/s of each and the median and range of the per-repeat ratios (the machine
   may be shared: a ratio from one repeat compares two runs seconds apart), and the same for
   CPU seconds per token (on a CPU, the cost itself, whatever else runs). Models: the
   built-in ``tiny`` (2 layers, hidden 64), a ``mid`` model built here (8 layers, hidden 512,
   random weights, the tiny tokenizer), and on a GPU a Qwen2.5-0.5B-shaped model in bf16.
   Targets: engine >= 1.0x generate at every concurrency on CPU; >= 2x at 128 on a GPU.
2. **Served, source trees interleaved** (``--only serve --trees OLD NEW``): ``agentgym serve`` from
   each source tree (e.g. a worktree of the previous commit and this one), on ``--serve-model``
   (default ``smollm2-135m``), driven with the same chat requests (``/v1/chat/completions``,
   ``--new-tokens`` tokens each, temperature 1, eos ignored) at 1 / 8 / 32 concurrent, the trees
   in alternation ``--repeats`` times: median tok/s, median time to the first streamed token of
   one request, and the server process's CPU seconds (psutil user + system) per 1,000 tokens.
   Only an interleaved comparison means anything on a shared machine.
3. **Prefix cache.** A multi-turn Sokoban rollout (the rollout runner against the embedded
   server, groups of ``n`` samples) with the prefix cache on and off: prompt tokens, tokens
   actually prefilled, and the tokens the prefix cache and the shared group prefill saved.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym.model import load_causal_lm, load_tokenizer, resolve_model_path  # noqa: E402
from agentgym.server.engine import Engine  # noqa: E402
from agentgym.server.sampling import GenerationParams  # noqa: E402


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_model(
    name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int | None = None
) -> Path:
    """A Qwen2 model with random weights and the tiny tokenizer, built once under the temp directory."""
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    target = Path(tempfile.gettempdir()) / f"agentgym-bench-{name}"
    if (target / "config.json").exists():
        return target
    tiny = Path(resolve_model_path("tiny"))
    base = AutoConfig.from_pretrained(tiny)
    config = Qwen2Config(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab or base.vocab_size,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id,
    )
    log(f"building the {name} model ({layers} layers, hidden {hidden}) ...")
    torch.manual_seed(0)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    Qwen2ForCausalLM(config).save_pretrained(staging)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (staging / f.name).write_bytes(f.read_bytes())
    staging.rename(target)
    return target


MODELS = {
    "tiny": lambda: "tiny",
    "mid": lambda: str(build_model("mid-8x512", 8, 512, 8, 2, 1408)),
    "qwen05": lambda: str(build_model("qwen05-shape", 24, 896, 14, 2, 4864, vocab=151936)),
}


# ---- 1. throughput ----------------------------------------------------------------------------------
def generate_rate(model, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """``(tokens/s, CPU seconds)`` of one ``generate`` on the whole batch."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # every sequence runs to new_tokens, like ignore_eos in the engine
    config.update(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
    )
    sync(model)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=config)
    sync(model)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return (out.shape[1] - prompts.shape[1]) * prompts.shape[0] / elapsed, cpu


def engine_rate(engine: Engine, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """``(tokens/s, CPU seconds of this process)`` of ``len(prompts)`` requests submitted at once."""

    async def run() -> float:
        start = time.perf_counter()
        requests = [
            engine.submit(p, GenerationParams(max_tokens=new_tokens, ignore_eos=True)) for p in prompts.tolist()
        ]
        done = await asyncio.gather(*(r.done for r in requests))
        elapsed = time.perf_counter() - start
        counts = [len(seqs[0].output_ids) for seqs in done]
        assert all(c == new_tokens for c in counts), counts
        return sum(counts) / elapsed

    cpu = time.process_time()
    rate = asyncio.run(run())
    return rate, time.process_time() - cpu


def sync(model) -> None:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def throughput(
    name: str, concurrencies: list[int], new_tokens: int, prompt_len: int, repeats: int, device: str
) -> list[dict]:
    path = MODELS[name]()
    dtype = "bfloat16" if device == "cuda" else "float32"
    model = load_causal_lm(path, dtype=dtype, device=device)
    engine_model = load_causal_lm(path, dtype=dtype, device=device)  # the engine's own copy, as a server has
    tok = load_tokenizer(path)
    engine = Engine(engine_model, tok, model_name=name, max_batch_size=max(concurrencies)).start()
    vocab = model.config.vocab_size
    rows = []
    try:
        gen = torch.Generator().manual_seed(0)
        for c in concurrencies:
            prompts = torch.randint(10, min(vocab, 600), (c, prompt_len), generator=gen).to(device)
            generate_rate(model, prompts, 4)  # warm-up (and CUDA graph capture for the engine)
            engine_rate(engine, prompts, min(new_tokens, 64))
            g, e = [], []
            for _ in range(repeats):  # interleaved, so both see the same background load
                g.append(generate_rate(model, prompts, new_tokens))
                e.append(engine_rate(engine, prompts, new_tokens))
            ratios = sorted(b[0] / a[0] for a, b in zip(g, e))
            cpu_ratios = sorted(a[1] / b[1] for a, b in zip(g, e))
            row = {
                "model": name,
                "c": c,
                "generate": statistics.median(r for r, _ in g),
                "engine": statistics.median(r for r, _ in e),
                "ratio": statistics.median(ratios),
                "lo": ratios[0],
                "hi": ratios[-1],
                "cpu": statistics.median(cpu_ratios),
                "cpu_lo": cpu_ratios[0],
                "cpu_hi": cpu_ratios[-1],
            }
            rows.append(row)
            print(
                f"| {name} | {device} | {c} | {row['generate']:,.0f} | {row['engine']:,.0f} | "
                f"**{row['ratio']:.2f}x** | {row['lo']:.2f}-{row['hi']:.2f}x | {row['cpu']:.2f}x | "
                f"{row['cpu_lo']:.2f}-{row['cpu_hi']:.2f}x |",
                flush=True,
            )
    finally:
        engine.stop()
    return rows


# ---- 2. served, source trees interleaved ------------------------------------------------------------
def serve_tree(tree: str, model: str, port: int, threads: int | None) -> tuple:
    """``agentgym serve`` from the source tree ``tree`` (its own process); returns (process, url)."""
    import subprocess

    import httpx

    command = [sys.executable, "-m", "agentgym.cli", "serve", "--model", model, "--port", str(port)]
    command += ["--max-batch-size", "32"] + (["--threads", str(threads)] if threads is not None else [])
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    proc = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agentgym serve from {tree} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise TimeoutError(f"agentgym serve from {tree} did not answer /health")


CHAT_TOPICS = ["the sea", "a red bicycle", "winter mornings", "prime numbers", "a lost key", "bread", "trains", "rain"]


def chat_body(model: str, i: int, new_tokens: int, stream: bool = False) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Write a short story about {CHAT_TOPICS[i % len(CHAT_TOPICS)]}."}],
        "max_tokens": new_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": stream,
    }


async def chat_round(url: str, model: str, c: int, new_tokens: int) -> float:
    """tok/s of ``c`` concurrent chat requests of ``new_tokens`` tokens."""
    import httpx

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:

        async def one(i: int) -> int:
            r = await client.post(url + "/v1/chat/completions", json=chat_body(model, i, new_tokens))
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        start = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(c)))
        elapsed = time.perf_counter() - start
    assert all(n == new_tokens for n in counts), counts
    return sum(counts) / elapsed


async def first_token_s(url: str, model: str) -> float:
    """Seconds to the first streamed token of one chat request."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        async with client.stream("POST", url + "/v1/chat/completions", json=chat_body(model, 0, 8, True)) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"content"' in line and '"content":""' not in line:
                    return time.perf_counter() - start
    raise RuntimeError("no token streamed")


def served(trees: list[str], model: str, concurrencies: list[int], new_tokens: int, repeats: int, threads) -> None:
    import psutil

    print(
        f"\n## served, interleaved: {model}, chat requests of {new_tokens} new tokens, {repeats} repeats "
        f"(medians; CPU = the server process's seconds per 1,000 tokens)\n"
    )
    print("| tree | concurrent | tok/s | CPU s / 1k tok | time to first token |")
    print("| --- | ---: | ---: | ---: | ---: |")
    servers = [serve_tree(tree, model, 18400 + i, threads) for i, tree in enumerate(trees)]
    try:
        results: dict = {}
        for _, url in servers:  # warm-up
            asyncio.run(chat_round(url, model, 2, 8))
        for _ in range(repeats):
            for (proc, url), tree in zip(servers, trees):
                ps = psutil.Process(proc.pid)
                results.setdefault((tree, "ttft"), []).append(asyncio.run(first_token_s(url, model)))
                for c in concurrencies:
                    before = sum(ps.cpu_times()[:2])
                    rate = asyncio.run(chat_round(url, model, c, new_tokens))
                    cpu = (sum(ps.cpu_times()[:2]) - before) / (c * new_tokens) * 1000
                    results.setdefault((tree, c), []).append((rate, cpu))
        for c in concurrencies:
            for tree in trees:
                rows = results[(tree, c)]
                ttft = statistics.median(results[(tree, "ttft")]) * 1000
                print(
                    f"| {tree} | {c} | {statistics.median(r for r, _ in rows):.1f} | "
                    f"{statistics.median(u for _, u in rows):.2f} | {ttft:.0f} ms |",
                    flush=True,
                )
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=30)


# ---- 3. prefix cache on a multi-turn rollout -----------------------------------------------------------
def sokoban(model: str, tasks: int, n: int, max_turns: int, concurrency: int) -> None:
    from agentgym.rollout import RolloutConfig
    from agentgym.server.handles import EmbeddedServerHandle

    print(
        f"\n## prefix cache: Sokoban, {tasks} tasks x {n} samples, up to {max_turns} turns, model {model}, "
        f"{concurrency} concurrent episodes\n"
    )
    print(
        "| prefix cache | turns | prompt tokens | prefilled | saved by the prefix cache | saved by shared group "
        "prefill | saved in all | wall s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    path = MODELS[model]()
    for slots in (None, 0):
        engine = Engine(
            load_causal_lm(path),
            load_tokenizer(path),
            model_name=model,
            max_batch_size=concurrency,
            prefix_cache_slots=slots,
        ).start()
        handle = EmbeddedServerHandle(engine)
        try:
            config = RolloutConfig(n=n, max_turns=max_turns, max_tokens=24, max_concurrency=concurrency)
            result, elapsed = asyncio.run(rollout(handle, path, config, tasks))
            s = engine.stats
            turns = sum(t.num_turns for t in result.trajectories)
            saved = s["prefix_cache_hit_tokens"] + s["shared_prefill_tokens"]
            print(
                f"| {'on' if slots is None else 'off'} | {turns} | {s['prompt_tokens']:,.0f} | "
                f"{s['prefill_tokens']:,.0f} | {s['prefix_cache_hit_tokens']:,.0f} | "
                f"{s['shared_prefill_tokens']:,.0f} | {saved:,.0f} ({saved / max(1, s['prompt_tokens']):.0%}) | "
                f"{elapsed:.1f} |",
                flush=True,
            )
        finally:
            handle.stop()


async def rollout(handle, tokenizer: str, config, tasks: int):
    from agentgym.rollout import RolloutRunner

    async with handle.client() as client:
        runner = RolloutRunner("sokoban", client, tokenizer=tokenizer, config=config)
        start = time.perf_counter()
        result = await runner.run(tasks=tasks)
        elapsed = time.perf_counter() - start
        await runner.aclose()
    return result, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--only", choices=["throughput", "sokoban", "serve"])
    parser.add_argument("--trees", nargs="+", default=["."], help="serve: source trees to compare, interleaved")
    parser.add_argument("--serve-model", default="smollm2-135m", help="serve: the model")
    parser.add_argument("--serve-threads", type=int, default=None, help="serve: agentgym serve --threads")
    parser.add_argument("--models", nargs="+", default=None, help="tiny mid (CPU); qwen05 is added on a GPU")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens or (32 if args.quick else 64)
    repeats = args.repeats or (3 if args.quick else 5)
    models = args.models or (["tiny", "mid", "qwen05"] if args.device == "cuda" else ["tiny", "mid"])
    print(
        f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    if args.only == "serve":
        concurrency = [c for c in args.concurrency if c <= 32]
        served(args.trees, args.serve_model, concurrency, args.new_tokens or 128, args.repeats or 3, args.serve_threads)
        return
    if args.only != "sokoban":
        print(
            f"\n## engine vs HF generate: {args.prompt_len}-token prompts, {new_tokens} new tokens, "
            f"{repeats} interleaved repeats (median tok/s; ratio = engine / generate, median and range)\n"
        )
        print(
            "Ratios above 1 favour the engine. The CPU ratio (generate's CPU seconds / the engine's, "
            "for the same tokens) is the steadier figure when other work shares the machine.\n"
        )
        print(
            "| model | device | concurrent | generate tok/s | engine tok/s | ratio | ratio range | CPU ratio | "
            "CPU ratio range |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in models:
            throughput(name, args.concurrency, new_tokens, args.prompt_len, repeats, args.device)
    if args.only != "throughput":
        sokoban("tiny", tasks=4 if args.quick else 8, n=4, max_turns=6 if args.quick else 10, concurrency=32)


if __name__ == "__main__":
    main()
