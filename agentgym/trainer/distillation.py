"""On-policy distillation in the PPO step: the teacher's logprobs (``Turn.teacher_logprobs``, filled by
``agentgym.rewards.teacher``) laid out like the batch's ``rollout_log_probs``, and the per-token
advantage of ``algos.distill`` added after the advantage estimator.

The student's logprob of a sampled token is the one the policy server reported when it sampled it
(``rollout_log_probs``): the policy the tokens came from, which the reverse KL is about.

With ``distillation.topk`` > 0 the teacher's top-k tokens and logprobs at each scored position go into
the batch too (``teacher_topk_ids``, ``teacher_topk_log_probs``, ``distill_mask``), and the actor reads
them against its own logits in its forward pass: with ``loss_mode=topk`` that is the loss
(``algos.distill.topk_reverse_kl``, ``workers.PolicyWorker.update_actor``), in either mode the
``distill/greedy_agreement*`` and ``distill/topk_kl*`` metrics. ``distill_action`` marks the tokens of each
reply's action (inside ``<action_tag>...</action_tag>``), so the metrics are also split into the
decision the env acts on (``_action``) and the rest of the reply (``_other``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from agentgym.trainer.algos.distill import compute_distillation_advantage
from agentgym.trainer.batch import Batch
from agentgym.types import Trajectory


def teacher_log_probs(
    trajectories: Sequence[Trajectory], batch: Batch, sampled_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(teacher_log_probs, scored)``: the teacher's logprobs in the batch's response layout, and a mask
    of the sampled tokens it scored (rows the trainer does not train, and turns no teacher scored, are 0).
    ``sampled_only``: the batch is the episode view (``batch.EpisodeMap``): sampled tokens only."""
    mask = batch["response_mask"]
    teacher = torch.zeros_like(batch["rollout_log_probs"])
    scored = torch.zeros_like(mask)
    for i, traj in enumerate(trajectories):
        if i >= len(batch) or not bool(batch["valid"][i]):
            continue
        values: list[float] = []
        has: list[float] = []
        for turn in traj.turns:
            if not sampled_only:
                values += [0.0] * len(turn.prompt_ids)
                has += [0.0] * len(turn.prompt_ids)
            if turn.teacher_logprobs:
                values += list(turn.teacher_logprobs)
                has += [1.0] * len(turn.response_ids)
            else:
                values += [0.0] * len(turn.response_ids)
                has += [0.0] * len(turn.response_ids)
        start = 0 if sampled_only else traj.prompt_length()
        values, has = values[start:], has[start:]
        teacher[i, : len(values)] = torch.tensor(values, dtype=teacher.dtype)
        scored[i, : len(has)] = torch.tensor(has, dtype=scored.dtype)
    return teacher, scored * mask


def teacher_topk(
    trajectories: Sequence[Trajectory], batch: Batch, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, log_probs, scored)``: the teacher's top-k tokens and logprobs ``(b, R, k)`` in the batch's
    response layout, and the mask of the sampled tokens they were given for (``response_mask`` applied)."""
    mask = batch["response_mask"]
    rows, width = mask.shape
    ids = torch.zeros((rows, width, k), dtype=torch.long)
    values = torch.zeros((rows, width, k), dtype=torch.float32)
    scored = torch.zeros_like(mask)
    for i, traj in enumerate(trajectories):
        if i >= len(batch) or not bool(batch["valid"][i]):
            continue
        at = -traj.prompt_length()
        for turn in traj.turns:
            at += len(turn.prompt_ids)
            n = len(turn.response_ids)
            if turn.teacher_topk_ids and at >= 0:
                if any(len(row) != k for row in turn.teacher_topk_ids):
                    raise ValueError(
                        f"a turn holds the teacher's top-{len(turn.teacher_topk_ids[0])} tokens where "
                        f"distillation.topk={k}: the teacher scored with another setting"
                    )
                end = min(at + n, width)
                ids[i, at:end] = torch.tensor(turn.teacher_topk_ids[: end - at], dtype=torch.long)
                values[i, at:end] = torch.tensor(turn.teacher_topk_logprobs[: end - at], dtype=torch.float32)
                scored[i, at:end] = 1
            at += n
    return ids, values, scored * mask


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from agentgym.model import load_tokenizer

    return load_tokenizer(path)


def action_spans(pieces: Sequence[str], tag: str) -> list[float]:
    """1.0 for each piece of a reply (its tokens' texts, in order) that overlaps the text inside
    ``<tag>...</tag>`` (to the reply's end when the tag is never closed), else 0.0."""
    text = "".join(pieces)
    spans = [m.span(1) for m in re.finditer(rf"<{re.escape(tag)}>(.*?)(?:</{re.escape(tag)}>|$)", text, re.S)]
    out, start = [], 0
    for piece in pieces:
        end = start + len(piece)
        out.append(1.0 if any(a < end and start < b for a, b in spans if b > a) else 0.0)
        start = end
    return out


def action_mask(trajectories: Sequence[Trajectory], batch: Batch, tokenizer: Any, tag: str) -> torch.Tensor:
    """``(b, R)``: 1 on the sampled tokens inside each reply's ``<tag>...</tag>`` (the action the env
    reads, e.g. Sokoban's moves), 0 elsewhere."""
    mask = batch["response_mask"]
    out = torch.zeros_like(mask)
    for i, traj in enumerate(trajectories):
        if i >= len(batch) or not bool(batch["valid"][i]):
            continue
        at = -traj.prompt_length()
        for turn in traj.turns:
            at += len(turn.prompt_ids)
            n = len(turn.response_ids)
            if at >= 0 and n:
                # token strings: byte-level (and sentencepiece) vocabularies write ASCII as itself
                pieces = [str(p) for p in tokenizer.convert_ids_to_tokens(list(turn.response_ids))]
                flags = action_spans(pieces, tag)[: max(0, mask.shape[1] - at)]
                out[i, at : at + len(flags)] = torch.tensor(flags, dtype=out.dtype)
            at += n
    return out * mask


def distill_advantages(
    cfg: DictConfig,
    batch: Batch,
    trajectories: Sequence[Trajectory],
    advantages: torch.Tensor,
    metrics: dict[str, float],
    sampled_only: bool = False,
) -> torch.Tensor:
    """``advantages`` with the distillation term (``distillation.kl_coef``, ``env_coef``) when
    ``distillation.enable``; unchanged otherwise. Adds ``distill/*`` to ``metrics``, and the tensors the
    actor's top-k loss and metrics read to ``batch``."""
    d = cfg.distillation
    if not d.enable:
        return advantages
    if sampled_only and d.loss_mode == "topk":
        raise ValueError(
            "distillation.loss_mode=topk reads the teacher's top-k tokens against the actor's logits row by "
            "row, which is not laid out for trajectories trained as several rows (trainer.step_wise_training "
            "or a context policy other than full): use distillation.loss_mode=sampled with them"
        )
    teacher, scored = teacher_log_probs(trajectories, batch, sampled_only)
    action = None
    if d.action_tag and not sampled_only:  # the episode view has no rows to split by token kind
        action = action_mask(trajectories, batch, _tokenizer(str(cfg.actor_rollout_ref.model.path)), d.action_tag)
        batch["distill_action"] = action
    if d.topk > 0 and not sampled_only:
        ids, values, has = teacher_topk(trajectories, batch, d.topk)
        batch["teacher_topk_ids"], batch["teacher_topk_log_probs"], batch["distill_mask"] = ids, values, has
    # the top-k form carries the teacher's signal in the actor's loss, not in the advantage
    kl_coef = d.kl_coef if d.loss_mode == "sampled" else 0.0
    out, extra = compute_distillation_advantage(
        advantages, batch["rollout_log_probs"], teacher, scored, kl_coef, d.env_coef, d.clip, action
    )
    metrics.update(extra)
    return out


def distilling(cfg: DictConfig) -> bool:
    """Whether a teacher's per-token advantages are added (so a step with flat env rewards still teaches)."""
    return cfg.distillation.enable
