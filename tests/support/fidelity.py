"""The token-fidelity promise in numbers (docs/deploy.md, "Token fidelity"): how far a policy server's
reported logprob of a sampled token may be from a float32 teacher-forced forward pass of the
same weights over the same token ids, by the dtype the server computes in.

float32 agrees to rounding. In 16 bits the weights and activations themselves are rounded
(bfloat16 keeps 8 bits of mantissa), so the logprobs move by up to ~1e-2 on small models;
measured on an H100 with the tiny model in bfloat16: 1.3e-3 to 2.6e-3.
"""

from __future__ import annotations

from typing import Any

import torch

LOGPROB_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}


def logprob_tolerance(dtype: Any) -> float:
    """The tolerance for a server computing in ``dtype`` (a torch dtype or its name)."""
    return LOGPROB_TOLERANCE[str(dtype).removeprefix("torch.")]


def teacher_forced(model: Any, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """float32 logprobs of ``token_ids`` after ``prompt_ids`` (the model on its own device)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], device=device)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(prompt_ids) - 1
    return [logprobs[start + i, t].item() for i, t in enumerate(token_ids)]


def max_difference(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))
