"""Constrained decoding: what a JSON-schema constraint costs the embedded engine per generated token.

    python benchmarks/constrained.py            # tiny + mid, 1 and 32 concurrent requests, and the libraries
    python benchmarks/constrained.py --quick    # fewer tokens and repeats

1. **Engine.** ``c`` requests (random token-id prompts, ``--new-tokens`` tokens each at temperature
   1, eos ignored) submitted at once to an ``Engine`` in this process, free and constrained to a
   JSON schema (``SCHEMA``: an array of at least 1000 small objects with strings, integers,
   booleans and an enum, so no reply completes before ``--new-tokens``: both runs generate the
   same number of tokens, and a constrained run spends them all inside the grammar). The two
   alternate ``--repeats`` times; the table shows the median time per generated token of each and
   the median and range of the per-repeat ratios (constrained / free). Models: the built-in
   ``tiny`` and benchmarks/engine.py's ``mid`` (8 layers, hidden 512, random weights, the tiny
   tokenizer); with ``--device cuda --models qwen05``, its Qwen2.5-0.5B-shaped model in bf16
   (a 152k vocabulary: the mask is 152k bits per row). Target: constrained <= 1.3x free at 32
   concurrent requests on ``mid`` (CPU).
2. **Libraries.** The cost per token of the grammar itself (compute the allowed-token mask, apply
   it to the logits, advance the matcher) for each grammar library with CPU wheels on PyPI that is
   installed (llguidance is agentgym's; xgrammar and outlines-core when present), 32 matchers in
   lock step on the tiny tokenizer with the same schema, tokens drawn at random among the allowed.
   This is what chose llguidance (``agentgym/server/grammar.py`` says why).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import MODELS  # noqa: E402  (benchmarks/engine.py: the same tiny and mid models)

from agentgym.client.structured import structured_outputs_constraint  # noqa: E402
from agentgym.model import load_causal_lm, load_tokenizer  # noqa: E402
from agentgym.server.engine import Engine  # noqa: E402
from agentgym.server.sampling import GenerationParams  # noqa: E402

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "qty": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["a", "bb", "ccc"]},
    },
    "required": ["name", "qty", "ok", "kind"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": ITEM, "minItems": 1000}


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- 1. the engine ------------------------------------------------------------------------------------
def run(engine: Engine, prompts: list[list[int]], new_tokens: int, grammar: str | None) -> float:
    """Seconds per generated token of ``prompts`` submitted at once."""

    async def go() -> float:
        start = time.perf_counter()
        requests = [
            engine.submit(p, GenerationParams(max_tokens=new_tokens, ignore_eos=True, grammar=grammar)) for p in prompts
        ]
        done = await asyncio.gather(*(r.done for r in requests))
        elapsed = time.perf_counter() - start
        counts = [len(seqs[0].output_ids) for seqs in done]
        assert all(c == new_tokens for c in counts), counts
        return elapsed / sum(counts)

    return asyncio.run(go())


def engine_rows(name: str, concurrencies: list[int], new_tokens: int, repeats: int, device: str) -> list[dict]:
    path = MODELS[name]()
    dtype = "bfloat16" if device == "cuda" else "float32"
    model, tok = load_causal_lm(path, dtype=dtype, device=device), load_tokenizer(path)
    engine = Engine(model, tok, model_name=name, max_batch_size=max(concurrencies)).start()
    grammar = engine.grammars.text(structured_outputs_constraint({"json": SCHEMA}))
    engine.grammars.check(grammar)
    rows = []
    try:
        gen = torch.Generator().manual_seed(0)
        for c in concurrencies:
            prompts = torch.randint(10, 600, (c, 32), generator=gen).tolist()
            run(engine, prompts, 16, None), run(engine, prompts, 16, grammar)  # warm-up
            free, constrained = [], []
            for _ in range(repeats):  # interleaved, so both see the same background load
                free.append(run(engine, prompts, new_tokens, None))
                constrained.append(run(engine, prompts, new_tokens, grammar))
            ratios = sorted(b / a for a, b in zip(free, constrained))
            row = {
                "model": name,
                "c": c,
                "free_ms": statistics.median(free) * 1e3,
                "constrained_ms": statistics.median(constrained) * 1e3,
                "ratio": statistics.median(ratios),
                "lo": ratios[0],
                "hi": ratios[-1],
            }
            rows.append(row)
            target = " (target <= 1.3x)" if name == "mid" and c == 32 else ""
            print(
                f"| {name} | {device} | {c} | {row['free_ms']:.3f} | {row['constrained_ms']:.3f} | "
                f"**{row['ratio']:.2f}x**"
                f"{target} | {row['lo']:.2f}-{row['hi']:.2f}x |",
                flush=True,
            )
    finally:
        engine.stop()
    return rows


# ---- 2. the libraries -----------------------------------------------------------------------------------
_BITS = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    allowed = ((bitmask[:, :, None] & _BITS) != 0).view(bitmask.shape[0], -1)[:, : logits.shape[1]]
    logits.masked_fill_(~allowed, float("-inf"))


def walk(fill, advance, batch: int, vocab: int, steps: int) -> float:
    """Microseconds per token to mask, apply and advance ``batch`` matchers for ``steps`` tokens."""
    gen = torch.Generator().manual_seed(0)
    spent = 0.0
    for _ in range(steps):
        logits = torch.randn(batch, vocab, generator=gen)
        start = time.perf_counter()
        fill(logits)
        tokens = logits.argmax(dim=-1).tolist()
        advance(tokens)
        spent += time.perf_counter() - start
    return spent / (steps * batch) * 1e6


def library_rows(batch: int, steps: int) -> None:
    tok = load_tokenizer("tiny")
    vocab = len(tok)
    eos = [tok.eos_token_id]
    bitmask = torch.zeros((batch, (vocab + 31) // 32), dtype=torch.int32)

    def llguidance_lib() -> tuple:
        import llguidance
        import llguidance.hf

        lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=eos)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
        matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(batch)]

        def fill(logits):
            for k, m in enumerate(matchers):
                m.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), bitmask.shape[1] * 4)
            apply_bitmask(logits, bitmask)

        return fill, lambda tokens: [m.consume_token(t) for m, t in zip(matchers, tokens)], version("llguidance")

    def xgrammar_lib() -> tuple:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=eos)
        compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]

        def fill(logits):
            for k, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, k)
            apply_bitmask(logits, bitmask)

        return fill, lambda tokens: [m.accept_token(t) for m, t in zip(matchers, tokens)], version("xgrammar")

    def outlines_core_lib() -> tuple:
        import outlines_core

        byte_of = _byte_decoder()
        vocabulary: dict[bytes, list[int]] = {}
        for text, i in tok.get_vocab().items():
            if i in eos:
                continue
            raw = text.encode() if i in tok.added_tokens_decoder else bytes(byte_of[ch] for ch in text)
            vocabulary.setdefault(raw, []).append(i)
        regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
        index = outlines_core.Index(regex, outlines_core.Vocabulary(eos[0], vocabulary))
        guides = [outlines_core.Guide(index) for _ in range(batch)]

        def fill(logits):
            bitmask.zero_()
            for k, g in enumerate(guides):
                row = bitmask[k]
                g.write_mask_into(row.data_ptr(), row.numel(), row.element_size())
            apply_bitmask(logits, bitmask)

        return fill, lambda tokens: [g.advance(t) for g, t in zip(guides, tokens)], version("outlines_core")

    for name, build in (
        ("llguidance", llguidance_lib),
        ("xgrammar", xgrammar_lib),
        ("outlines-core", outlines_core_lib),
    ):
        try:
            start = time.perf_counter()
            fill, advance, release = build()
            setup = time.perf_counter() - start
        except ImportError:
            print(f"| {name} | not installed | | |")
            continue
        us = walk(fill, advance, batch, vocab, steps)
        print(f"| {name} | {release} | {setup * 1e3:.0f} | {us:.1f} |", flush=True)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (what byte-level BPE vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--models", nargs="+", default=["tiny", "mid"], help="tiny mid qwen05 (benchmarks/engine.py's)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--only", choices=["engine", "libraries"])
    parser.add_argument("--device", default="cpu", help="cpu (the target's), or cuda (qwen05 then joins the models)")
    args = parser.parse_args()
    new_tokens = args.new_tokens or (48 if args.quick else 128)
    repeats = args.repeats or (3 if args.quick else 5)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if args.only != "libraries":
        print(
            f"\n## engine: time per generated token, free vs constrained to a JSON schema ({new_tokens} tokens "
            f"per request, {repeats} interleaved repeats; ratio = constrained / free, median and range)\n"
        )
        print("| model | device | concurrent | free ms/token | constrained ms/token | ratio | ratio range |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for name in args.models:
            engine_rows(name, args.concurrency, new_tokens, repeats, args.device)
    if args.only != "engine":
        print("\n## grammar libraries: mask + apply + advance, 32 matchers on the tiny tokenizer, same schema\n")
        print("| library | version | setup ms | us per token |")
        print("| --- | --- | ---: | ---: |")
        library_rows(32, 24 if args.quick else 64)


if __name__ == "__main__":
    main()
