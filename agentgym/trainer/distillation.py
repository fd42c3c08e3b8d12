"""On-policy distillation in the PPO step: the teacher's logprobs (``Turn.teacher_logprobs``, filled by
``agentgym.rewards.teacher``) laid out like the batch's ``rollout_log_probs``, and the per-token
advantage of ``algos.distill`` added after the advantage estimator.

The student's logprob of a sampled token is the one the policy server reported when it sampled it
(``rollout_log_probs``): the policy the tokens came from, which the reverse KL is about.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def distill_advantages(
    cfg: DictConfig,
    batch: Batch,
    trajectories: Sequence[Trajectory],
    advantages: torch.Tensor,
    metrics: dict[str, float],
    sampled_only: bool = False,
) -> torch.Tensor:
    """``advantages`` with the distillation term (``distillation.kl_coef``, ``env_coef``) when
    ``distillation.enable``; unchanged otherwise. Adds ``distill/*`` to ``metrics``."""
    d = cfg.distillation
    if not d.enable:
        return advantages
    teacher, scored = teacher_log_probs(trajectories, batch, sampled_only)
    out, extra = compute_distillation_advantage(
        advantages, batch["rollout_log_probs"], teacher, scored, d.kl_coef, d.env_coef, d.clip
    )
    metrics.update(extra)
    return out


def distilling(cfg: DictConfig) -> bool:
    """Whether a teacher's per-token advantages are added (so a step with flat env rewards still teaches)."""
    return cfg.distillation.enable
