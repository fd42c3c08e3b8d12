"""Masked statistics over ``(batch, seq)`` tensors (veRL ``verl/utils/torch_functional.py``), and the
error for an unknown name in a registry."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    pass

Tensor = torch.Tensor


def unknown_name(kind: str, name: str, known: Sequence[str]) -> ValueError:
    """A ValueError that lists the known names and suggests the closest one."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(known))}.")


# ---- masked statistics (verl/utils/torch_functional.py) --------------------------------


def masked_sum(values: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by the mask).

    Mirrors veRL ``torch_functional.masked_sum``: values outside the mask are replaced by 0
    before multiplying, so a NaN/inf there cannot leak into the sum or its gradient.
    """
    mask = mask.to(values.dtype)
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (kept * mask).sum() if axis is None else (kept * mask).sum(dim=axis)


def masked_mean(values: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """Mean of ``values`` over the masked elements (all of them, or along ``axis``).

    Mirrors veRL ``torch_functional.masked_mean``: ``masked_sum / (mask.sum() + 1e-8)``, so an
    empty mask gives 0 instead of NaN.
    """
    mask = mask.to(values.dtype)
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements; ``unbiased`` applies Bessel's correction n/(n-1).

    Mirrors veRL ``torch_functional.masked_var``, including its errors: with ``unbiased`` a
    mask selecting 0 or 1 elements raises (there is no sample variance of one number).
    """
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no elements; at least one must be 1.")
        if n == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance divides by "
                "zero. Train on a batch with more than one response token."
            )
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the mask.

    Mirrors veRL ``torch_functional.masked_whiten``. Every position is transformed (masked-out
    ones too), but only masked-in ones enter the statistics. ``shift_mean=False`` adds the
    mean back (scale only).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# ---- entropy and value losses --------------------------------------------------------


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dimension: ``logsumexp(z) - sum softmax(z) * z``.

    Mirrors veRL ``torch_functional.entropy_from_logits``; ``(batch, seq, vocab) -> (batch, seq)``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def log_probs_from_logits(
    logits: Tensor, targets: Tensor, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of ``targets`` under ``logits`` (``log_softmax`` gathered, no temperature) and, when
    asked, the entropy per position; ``(b, R, vocab), (b, R) -> (b, R), (b, R) | None``.

    The one computation both forward paths share (padded ``forward.policy_forward`` and packed
    ``packing.packed_policy_forward``). Mirrors veRL ``torch_functional.logprobs_from_logits``. The
    entropy is computed without gradient unless ``entropy_grad`` (an entropy bonus in the loss).
    """
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if not with_entropy:
        return log_probs, None
    if entropy_grad:
        return log_probs, entropy_from_logits(logits)
    with torch.no_grad():
        return log_probs, entropy_from_logits(logits.detach())


def masked_stats(name: str, values: Tensor, mask: Tensor) -> dict[str, float]:
    """``{name}/mean``, ``/max`` and ``/min`` of ``values`` where ``mask`` is set (nothing when it is empty)."""
    if mask.sum() == 0:
        return {}
    picked = values[mask.bool()]
    return {
        f"{name}/mean": float(picked.mean()),
        f"{name}/max": float(picked.max()),
        f"{name}/min": float(picked.min()),
    }
