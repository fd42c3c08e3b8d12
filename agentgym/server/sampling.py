"""What a request asks of the engine (``GenerationParams``) and how one token per row is drawn.

The engine samples every running row in one batched call (``sample_rows``): temperature,
top-k and top-p come in as per-row tensors and each row brings its own uniform number, so
nothing in a decode step loops over rows in Python. The uniform numbers come from a
counter-based generator (``counter_uniforms``: splitmix64 of the row's seed and its token
index), so a seeded request samples the same tokens whatever else is in the batch, and
unseeded rows get a random seed when they are admitted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentgym.types import SamplingFields


@dataclass
class GenerationParams(SamplingFields):
    """What one request asks of the engine, after validation: the shared sampling fields
    (``agentgym.types.SamplingFields``) and what only the server decides."""

    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    grammar: str | None = None  # an llguidance grammar the reply must match (``grammar.py``)


def _int64(value: int) -> int:
    """A 64-bit constant as the signed integer torch stores it."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer (integer products wrap around, as the algorithm wants)."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def seed_key(seed: int) -> int:
    """The stream key of a request seed (``counter_uniforms`` takes keys, so a step mixes once)."""
    return int(_mix(torch.tensor([seed], dtype=torch.long))[0])


def counter_uniforms(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One uniform number in [0, 1) per row: draw number ``counters`` of the stream ``keys`` (int64,
    from ``seed_key``): splitmix64's output for the state ``key + (counter + 1) * golden``. 24 bits,
    so the number is exact in float32 and strictly below 1."""
    z = _mix(keys + (counters + 1) * _GOLDEN)
    return _shift_right(z, 40).to(torch.float32) * (1.0 / (1 << 24))


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    any_sampled: bool = True,
    any_filtered: bool = True,
    log_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row: greedy where ``temperature <= 0``, else temperature / top-k / top-p sampling
    with the row's ``uniforms`` number (inverse CDF: the same categorical distribution as
    ``torch.multinomial``, at a fraction of its cost on CPU).

    ``top_k``: 0 is off; ``top_p``: 1 is off. ``any_sampled`` / ``any_filtered`` are what the caller
    already knows (no row samples / no row filters), so the common cases skip work without a
    device sync. ``log_probs``: ``log_softmax(logits)`` when the caller has it and every row samples
    at temperature 1 unfiltered (its probabilities are then the sampling distribution).
    """
    if not any_sampled:
        return logits.argmax(dim=-1)
    if log_probs is not None:
        probs = log_probs.exp()
    else:
        greedy = temperature <= 0
        scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
        if any_filtered:
            vocab = logits.shape[-1]
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=logits.device)[None, :]
            remove = ranks >= torch.where(top_k > 0, top_k, vocab)[:, None]
            probs_sorted = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
            cum = probs_sorted.cumsum(dim=-1)
            remove |= ((cum - probs_sorted) >= top_p[:, None]) & (top_p < 1.0)[:, None]  # smallest prefix >= top_p
            sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
        probs = torch.softmax(scaled, dim=-1)
    cum = probs.cumsum(dim=-1)
    # the first token whose cumulative probability exceeds u * total: never one of probability 0,
    # except when rounding puts u * total at the very end; such a row takes its most likely token
    sampled = torch.searchsorted(cum, uniforms[:, None].to(cum.dtype) * cum[:, -1:], right=True)[:, 0]
    sampled = sampled.clamp_(max=cum.shape[-1] - 1)
    best = logits.argmax(dim=-1)
    sampled = torch.where(probs.gather(1, sampled[:, None])[:, 0] > 0, sampled, best)
    return sampled if log_probs is not None else torch.where(temperature <= 0, best, sampled)


def sample_tokens(
    logits: torch.Tensor,
    params: list[GenerationParams],
    generators: list[torch.Generator | None],
    default_generator: torch.Generator,
) -> torch.Tensor:
    """``sample_rows`` for rows described by ``GenerationParams``, drawing each row's uniform number
    from its own generator where it has one (so it samples the same alone or in a batch), else
    from ``default_generator``."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device)
    top_k = torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.long, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=device)
    u = torch.rand((len(params),), generator=default_generator, device=device)
    for i, generator in enumerate(generators):
        if generator is not None:
            u[i] = torch.rand(1, generator=generator, device=device)
    return sample_rows(
        logits,
        temperature,
        top_k,
        top_p,
        u,
        any_sampled=any(p.temperature > 0 for p in params),
        any_filtered=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
    )
