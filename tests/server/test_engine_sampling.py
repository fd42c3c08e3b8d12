"""Batched sampling: the counter-based uniform numbers and the one-call sampler the engine uses."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentgym.model import load_causal_lm, load_tokenizer
from agentgym.server.engine import Engine
from agentgym.server.sampling import GenerationParams, counter_uniforms, sample_rows, seed_key


def test_counter_uniforms_are_uniform_reproducible_and_independent_of_the_batch():
    keys = torch.tensor([seed_key(s) for s in range(2000)])
    draws = torch.stack([counter_uniforms(keys, torch.full_like(keys, k)) for k in range(50)])
    assert draws.min() >= 0 and draws.max() < 1
    counts = torch.histc(draws.flatten(), bins=20, min=0, max=1)
    expected = draws.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45, f"chi-square {chi2:.1f} with 19 degrees of freedom"  # p < 1e-3 when uniform
    # neighbouring seeds and neighbouring draws are not correlated
    assert abs(float(torch.corrcoef(torch.stack([draws[0, :-1], draws[0, 1:]]))[0, 1])) < 0.1
    assert abs(float(torch.corrcoef(torch.stack([draws[:-1, 0], draws[1:, 0]]))[0, 1])) < 0.1
    # row 7's draws are the same whatever sits beside it
    alone = counter_uniforms(keys[7:8], torch.tensor([3]))
    assert torch.equal(alone, draws[3, 7:8])


def test_sample_rows_follows_each_rows_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    rows = 20_000
    logits = probs.log().repeat(rows, 1)
    u = counter_uniforms(torch.tensor([seed_key(1)] * rows), torch.arange(rows))
    ones, zeros = torch.ones(rows), torch.zeros(rows, dtype=torch.long)
    for kwargs, want in (
        ({}, [0.5, 0.0, 0.3, 0.2]),
        ({"log_probs": torch.log_softmax(logits, -1)}, [0.5, 0.0, 0.3, 0.2]),
        ({"top_k": torch.full((rows,), 2)}, [0.625, 0.0, 0.375, 0.0]),
        ({"top_p": torch.full((rows,), 0.6)}, [0.625, 0.0, 0.375, 0.0]),
        ({"temperature": torch.full((rows,), 0.5)}, [0.5**2 / 0.38, 0.0, 0.09 / 0.38, 0.04 / 0.38]),
    ):
        args = {"temperature": ones, "top_k": zeros, "top_p": ones, **kwargs}
        tokens = sample_rows(
            logits,
            args["temperature"],
            args["top_k"],
            args["top_p"],
            u,
            any_filtered="top_k" in kwargs or "top_p" in kwargs,
            log_probs=kwargs.get("log_probs"),
        )
        got = (torch.bincount(tokens, minlength=4) / rows).tolist()
        assert got[1] == 0.0, "a token of probability 0 was sampled"
        assert got == pytest.approx(want, abs=0.015), kwargs.keys()
    # greedy rows take the argmax, beside sampled ones
    mixed = torch.tensor([0.0, 1.0] * 4)
    out = sample_rows(logits[:8], mixed, zeros[:8], ones[:8], u[:8], any_filtered=False)
    assert out[0::2].tolist() == [0] * 4


def test_engine_rows_sample_independently_and_greedy_rows_follow_the_argmax():
    model = load_causal_lm("tiny")
    engine = Engine(model, load_tokenizer("tiny"), max_batch_size=8).start()
    try:

        async def go():
            greedy = engine.submit([5, 6, 7], GenerationParams(max_tokens=10, temperature=0.0, ignore_eos=True))
            sampled = engine.submit([5, 6, 7], GenerationParams(max_tokens=10, ignore_eos=True), n=6)
            return (await greedy.done)[0], await sampled.done

        greedy, sampled = asyncio.run(go())
        ids = [5, 6, 7]
        with torch.no_grad():
            for tok in greedy.output_ids:
                assert tok == int(model(torch.tensor([ids])).logits[0, -1].argmax())
                ids.append(tok)
        assert len({tuple(s.output_ids) for s in sampled}) == 6
    finally:
        engine.stop()
