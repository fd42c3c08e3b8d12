"""Sequence packing (veRL's ``use_remove_padding``, ChatLearn's ``packing``): a micro-batch's rows laid
end to end in one sequence, with no padding.

Each row keeps its own positions (``position_ids`` restart at 0) and attends only to itself: the
attention mask is block-diagonal and causal within each block (a boolean ``(1, 1, L, L)`` mask,
which Hugging Face models take as given). The outputs are read back into the usual ``(b, R)``
response layout, so the losses and their masks are those of the padded path exactly; only the
computation differs (no padded positions). With a dense mask the attention costs ``L^2`` for the
packed length ``L``, so packing pays where padding dominates (long-tail batches) and the budget
(``ppo_max_token_len_per_gpu`` / ``max_token_in_packing``) keeps ``L`` bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]


@dataclass
class Packed:
    """A micro-batch as one sequence, and where each row's response positions are in it."""

    input_ids: torch.Tensor  # (1, L)
    attention_mask: torch.Tensor  # (1, 1, L, L) bool: row-local causal
    position_ids: torch.Tensor  # (1, L)
    predict_at: torch.Tensor  # (b, R_eff): the packed position whose output predicts each response token
    valid: torch.Tensor  # (b, R_eff): response token exists


def pack(micro: Tensors) -> Packed:
    """Lay the rows of ``micro`` (``input_ids``, ``attention_mask``, ``prompt_lengths``) end to end."""
    lengths = micro["attention_mask"].sum(-1).long()
    device = micro["input_ids"].device
    pieces = [micro["input_ids"][i, : int(n)] for i, n in enumerate(lengths.tolist())]
    input_ids = torch.cat(pieces).unsqueeze(0)
    total = input_ids.shape[1]
    segment = torch.repeat_interleave(torch.arange(len(pieces), device=device), lengths)
    causal = torch.ones(total, total, dtype=torch.bool, device=device).tril_()
    mask = (segment.unsqueeze(1) == segment.unsqueeze(0)) & causal
    position_ids = torch.cat([torch.arange(int(n), device=device) for n in lengths.tolist()]).unsqueeze(0)
    starts = torch.cumsum(lengths, 0) - lengths
    prompt = micro["prompt_lengths"].long()
    response = (lengths - prompt).clamp(min=0)
    width = max(1, int(response.max()))
    step = torch.arange(width, device=device).unsqueeze(0)
    first = (starts + prompt - 1).unsqueeze(1)
    valid = step < response.unsqueeze(1)
    predict_at = torch.where(valid, first + step, first.expand(-1, width))
    return Packed(input_ids, mask.view(1, 1, total, total), position_ids, predict_at, valid)


def packed_policy_forward(
    model: nn.Module, micro: Tensors, with_entropy: bool = False, entropy_grad: bool = False, aux: Tensors | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``forward.policy_forward`` on the packed micro-batch: each row's response log-probs ``(b, R)``
    (0 past the row's end) and entropies; logits only where a response token is predicted."""
    from agentgym.trainer import algos

    packed = pack(micro)
    b, width = packed.predict_at.shape
    out = model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask,
        position_ids=packed.position_ids,
        logits_to_keep=packed.predict_at.reshape(-1),
        use_cache=False,
    )
    logits = out.logits.reshape(b, width, -1).float()
    targets = micro["responses"][:, :width]
    if targets.shape[1] < width:
        targets = nn.functional.pad(targets, (0, width - targets.shape[1]))
    log_probs, entropy = algos.log_probs_from_logits(logits, targets, with_entropy, entropy_grad)
    log_probs = torch.where(packed.valid, log_probs, torch.zeros_like(log_probs))
    if entropy is not None:
        entropy = torch.where(packed.valid, entropy, torch.zeros_like(entropy))
    if aux is not None:
        from agentgym.trainer.algos.distill import teacher_support

        teacher_support(logits, micro, aux, micro["responses"].shape[1])
    return _to_width(log_probs, micro), _to_width(entropy, micro) if entropy is not None else None


def packed_value_forward(model: nn.Module, micro: Tensors) -> torch.Tensor:
    """``forward.value_forward`` on the packed micro-batch: ``V(s_t)`` per response token, ``(b, R)``."""
    packed = pack(micro)
    hidden = model.body(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask,
        position_ids=packed.position_ids,
        use_cache=False,
    ).last_hidden_state
    values = model.value_head(hidden).squeeze(-1)[0].float()
    picked = values[packed.predict_at]
    return _to_width(torch.where(packed.valid, picked, torch.zeros_like(picked)), micro)


def _to_width(values: torch.Tensor, micro: Tensors) -> torch.Tensor:
    full = micro["responses"].shape[1]
    if values.shape[1] < full:
        return nn.functional.pad(values, (0, full - values.shape[1]))
    return values[:, :full]
