"""Forward passes of the trainer's models over a micro-batch: the policy's log-probs (and entropy)
on the response region, and the critic's values (a value head on the policy's architecture).

Log-probs are ``log_softmax`` of the raw logits (no temperature), as the policy servers report
them, so ``use_rollout_log_probs`` and recomputed old log-probs mean the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agentgym.trainer import algos
from agentgym.trainer.algos.distill import teacher_support

Tensors = dict[str, torch.Tensor]


def _response_positions(micro: Tensors) -> tuple[torch.Tensor, int, int, int]:
    """Trim a micro-batch's padding; returns (index of the logit that predicts each response
    token relative to the first kept position, kept sequence length, first kept position, R_eff)."""
    lengths = micro["attention_mask"].sum(-1)
    prompt = micro["prompt_lengths"]
    seq_len = int(lengths.max())
    resp_len = max(1, int((lengths - prompt).max()))
    first = int(prompt.min()) - 1  # the logit at position p-1 predicts token p
    offsets = (prompt - 1 - first).unsqueeze(1) + torch.arange(resp_len, device=prompt.device).unsqueeze(0)
    offsets = offsets.clamp(max=seq_len - first - 1)
    return offsets, seq_len, first, resp_len


def policy_forward(
    model: nn.Module,
    micro: Tensors,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    packed: bool = False,
    aux: Tensors | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of each row's response tokens, ``(b, R)`` (0 past the row's end), and the
    per-token entropy when asked. Only the logits of response positions are computed
    (``logits_to_keep``), which matters with a large vocabulary. ``packed``: the rows run as one
    sequence with no padding (``packing.py``, veRL's ``use_remove_padding``). ``aux``: filled with
    the student's view of a distillation teacher's top-k tokens (``teacher_support``)."""
    if packed:
        from agentgym.trainer.packing import packed_policy_forward

        return packed_policy_forward(model, micro, with_entropy, entropy_grad, aux)
    offsets, seq_len, first, resp_len = _response_positions(micro)
    input_ids = micro["input_ids"][:, :seq_len]
    attention_mask = micro["attention_mask"][:, :seq_len]
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=seq_len - first, use_cache=False)
    logits = out.logits
    vocab = logits.shape[-1]
    logits = torch.gather(logits, 1, offsets.unsqueeze(-1).expand(-1, -1, vocab)).float()
    log_probs, entropy = algos.log_probs_from_logits(
        logits, micro["responses"][:, :resp_len], with_entropy, entropy_grad
    )
    full = micro["responses"].shape[1]
    teacher_support(logits, micro, aux, full)
    if resp_len < full:
        log_probs = nn.functional.pad(log_probs, (0, full - resp_len))
        entropy = nn.functional.pad(entropy, (0, full - resp_len)) if entropy is not None else None
    return log_probs, entropy


class ValueModel(nn.Module):
    """A value head (one linear unit, zero-initialised) on the policy's transformer body."""

    def __init__(self, path: str, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from transformers import AutoModel

        from agentgym.model import resolve_model_path

        self.body = AutoModel.from_pretrained(resolve_model_path(path), dtype=dtype)
        hidden = self.body.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.value_head(hidden).squeeze(-1)


def value_forward(model: ValueModel, micro: Tensors, packed: bool = False) -> torch.Tensor:
    """``V(s_t)`` for each response token: the value at the position before it, ``(b, R)``."""
    if packed:
        from agentgym.trainer.packing import packed_value_forward

        return packed_value_forward(model, micro)
    offsets, seq_len, first, resp_len = _response_positions(micro)
    values = model(micro["input_ids"][:, :seq_len], micro["attention_mask"][:, :seq_len])[:, first:].float()
    values = torch.gather(values, 1, offsets)
    full = micro["responses"].shape[1]
    return nn.functional.pad(values, (0, full - resp_len)) if resp_len < full else values


def select_rows(tensors: Tensors, rows: Sequence[int], device: str) -> Tensors:
    index = torch.as_tensor(list(rows), dtype=torch.long)
    return {k: v.index_select(0, index).to(device) for k, v in tensors.items()}


def chunks(rows: Sequence[int], size: int) -> list[list[int]]:
    rows = list(rows)
    return [rows[i : i + size] for i in range(0, len(rows), max(1, size))] or [[]]
