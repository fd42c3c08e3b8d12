"""The engine's forward passes on several model families, each built here with random weights:
the lean forward (Llama, Qwen2, Qwen3, Mistral with a sliding window) and transformers' own
forward over the engine's KV cache (any other model) must both give the logprobs of a
teacher-forced forward of the transformers model, across a prefill, decode steps and a
second turn served from the prefix cache."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym.model import load_tokenizer
from agentgym.server import lean_forward, packed_linears
from agentgym.server.engine import Engine
from agentgym.server.sampling import GenerationParams

SMALL = dict(
    vocab_size=640,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=631,
    pad_token_id=632,
)


def build(kind: str):
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if kind == "llama":
        config = LlamaConfig(
            **SMALL,
            attention_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    elif kind == "qwen3":
        config = Qwen3Config(**SMALL, head_dim=24)
    elif kind == "mistral":
        config = MistralConfig(**SMALL, sliding_window=9)
    elif kind == "qwen2-mixed":  # sliding-window layers below full ones (max_window_layers)
        config = Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=7, max_window_layers=2)
    elif kind == "gpt2":
        config = GPT2Config(
            vocab_size=640, n_embd=64, n_layer=2, n_head=4, n_positions=512, eos_token_id=631, pad_token_id=632
        )
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # a wider spread of logits than the initialisation's
        for p in model.parameters():
            p.mul_(3.0)
    return model


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return [logprobs[start + i, t].item() for i, t in enumerate(tokens)]


def generate(engine, prompts, **params):
    async def go():
        reqs = [engine.submit(p, GenerationParams(**{"max_tokens": 16, "ignore_eos": True, **params})) for p in prompts]
        return [(await r.done)[0] for r in reqs]

    return asyncio.run(go())


PACKED = pytest.mark.skipif(not packed_linears.available(torch.zeros(1)), reason="no oneDNN weight packing here")


@pytest.mark.parametrize(
    "kind,lean,pack",
    [
        ("llama", True, False),
        ("qwen3", True, False),
        ("mistral", True, False),
        ("qwen2-mixed", True, False),
        ("llama", False, False),
        ("gpt2", False, False),
        # the lean forward's linear layers from oneDNN-packed weights (on by default for wide CPU models)
        pytest.param("llama", True, True, marks=PACKED),  # attention biases
        pytest.param("qwen3", True, True, marks=PACKED),  # q/k norms
        pytest.param("mistral", True, True, marks=PACKED),
    ],
)
def test_engine_logprobs_equal_a_teacher_forced_forward(kind, lean, pack):
    model = build(kind)
    assert lean_forward.supports(model) == (kind != "gpt2")
    served = build(kind)
    engine = Engine(served, load_tokenizer("tiny"), max_batch_size=4, lean=lean, pack_weights=pack).start()
    try:
        assert (engine.lean is not None) == lean
        assert not lean or (engine.lean.packed is not None) == pack
        prompts = [list(range(10, 10 + k)) for k in (5, 23, 14)]
        first = generate(engine, prompts)
        turns = [p + s.output_ids + [3, 4] for p, s in zip(prompts, first)]
        second = generate(engine, turns, max_tokens=12)
        for prompt, seq in [*zip(prompts, first), *zip(turns, second)]:
            expected = teacher_forced(model, prompt, seq.output_ids)
            # float32 logits depend slightly on the batch a request shares (which the arrival order decides):
            # qwen3 is typically 3-4e-5 off a batch-of-one forward, and 1.03e-4 was seen once under CI load
            assert max(abs(a - b) for a, b in zip(seq.logprobs, expected)) < 2e-4, kind
        assert all(s.cached_tokens == len(p) - 3 for p, s in zip(turns, second))
    finally:
        engine.stop()


def test_models_with_other_attention_kinds_are_refused_with_a_way_out():
    model = build("llama")
    model.config.layer_types = ["full_attention", "linear_attention", "full_attention"]
    with pytest.raises(ValueError, match="vllm"):
        Engine(model, load_tokenizer("tiny"))
