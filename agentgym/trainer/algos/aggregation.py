"""Loss aggregation: how token losses become one number (veRL ``core_algos.agg_loss``, keyed by
``actor.loss_agg_mode``)."""

from __future__ import annotations

import torch

from agentgym.trainer.algos.stats import unknown_name

Tensor = torch.Tensor


# ---- loss aggregation ----------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | Tensor | None = None,
    global_batch_size: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """Reduce a ``(batch, seq)`` loss matrix to a scalar; ``loss_agg_mode`` is veRL's key.

    Mirrors veRL ``core_algos.agg_loss`` (the current, global-batch-aware version). With
    ``m`` the mask, ``S_i = sum_t m_it * loss_it`` the masked token-sum of row i, and ``B`` the
    number of rows with at least one masked-in token:

    - ``token-mean``: ``sum_i S_i / batch_num_tokens * dp_size`` (default: the local token count).
    - ``token-sum``: ``sum_i S_i * dp_size`` (veRL 0.9: no normalisation at all; with ``dp_size`` ranks
      averaging gradients, the step is that of the sum over the global mini-batch's tokens).
    - ``seq-mean-token-sum``: ``sum_i S_i / global_batch_size * dp_size`` (default ``B``).
    - ``seq-mean-token-mean``: ``sum_i (S_i / (n_i + 1e-8)) / global_batch_size * dp_size``.
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): ``seq-mean-token-sum / loss_scale_factor``; the
      factor defaults to the mask's last dimension (the padded response length). Set it to a
      constant (e.g. the max response length) to keep the scale the same across batches.
      (Older veRL releases divided the *batch* sum, not the sequence mean, by the length.)

    Rows with no masked-in token count in no denominator. ``dp_size``, ``batch_num_tokens``
    and ``global_batch_size`` let data-parallel ranks normalise by the global batch; with
    ``dp_size > 1`` the global counts are required.

    Differs from veRL: a micro-batch with no masked-in token at all gives 0, not 0/0 = NaN.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise unknown_name("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = loss_mask.to(loss_mat.dtype)
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: token-mean with dp_size > 1 needs the global batch_num_tokens")
            batch_num_tokens = mask.sum().clamp(min=1)
        return masked.sum() / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked.sum() * dp_size
    tokens_per_row = mask.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        row_losses = masked.sum(dim=-1) / (tokens_per_row + 1e-8)
    else:
        row_losses = masked.sum(dim=-1)
    nonempty = (tokens_per_row > 0).to(loss_mat.dtype)
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(f"agg_loss: {loss_agg_mode} with dp_size > 1 needs the global_batch_size")
        global_batch_size = nonempty.sum().clamp(min=1)
    loss = (row_losses * nonempty).sum() / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss
