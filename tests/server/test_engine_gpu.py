"""The engine on a CUDA device: decode steps replayed from CUDA graphs give the tokens and logprobs
an eager engine gives, and both match a teacher-forced forward. Skipped without CUDA (the CPU
tests run the same padded steps eagerly: tests/server/test_engine_cache.py)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentgym.model import load_causal_lm, load_tokenizer
from agentgym.server.engine import Engine
from agentgym.server.sampling import GenerationParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def run(engine, prompts, **params):
    async def go():
        reqs = [
            engine.submit(p, GenerationParams(**{"max_tokens": 24, "ignore_eos": True, "seed": 5, **params}))
            for p in prompts
        ]
        return [(await r.done)[0] for r in reqs]

    return asyncio.run(go())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_decode_matches_eager_decode(dtype):
    tok = load_tokenizer("tiny")
    prompts = [list(range(10, 10 + k)) for k in (3, 40, 17, 90, 5)]
    results = {}
    for graphs in (True, False):
        engine = Engine(
            load_causal_lm("tiny", dtype=dtype, device="cuda"), tok, max_batch_size=8, cuda_graphs=graphs
        ).start()
        try:
            first = run(engine, prompts)
            turns = [p + s.output_ids + [7] for p, s in zip(prompts, first)]
            second = run(engine, turns)
            results[graphs] = [*first, *second]
            if graphs:
                assert engine.graphs is not None and engine.graphs.capture and engine.graphs.captured > 0
        finally:
            engine.stop()
    model = load_causal_lm("tiny", dtype="float32", device="cuda")
    tolerance = 1e-4 if dtype == "float32" else 0.1
    for with_graph, eager, prompt in zip(results[True], results[False], prompts + [None] * len(prompts)):
        assert with_graph.output_ids == eager.output_ids or dtype == "bfloat16"
        assert max(abs(a - b) for a, b in zip(with_graph.logprobs, eager.logprobs)) < tolerance
        if prompt is not None:
            ids = torch.tensor([prompt + with_graph.output_ids], device="cuda")
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].float(), -1)
            ref = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(with_graph.output_ids)]
            assert max(abs(a - b) for a, b in zip(with_graph.logprobs, ref)) < tolerance
