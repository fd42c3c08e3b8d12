"""ROLL's reward shaping and advantage post-processing, under ROLL's config names.

Before the advantage estimator (``shape_rewards``), each trajectory's score (the sum of its token
rewards) may be

1. normalised within groups (``algorithm.reward_normalization``, ROLL's agentic pipeline):
   ``grouping`` picks the groups: ``state`` (the task's group: same env seed/config), ``batch``
   (the whole batch) or ``inductive`` (the env tag); ``method``: ``identity``, ``mean``
   (subtract the group mean), ``mean_std`` (and divide by the group's std + 1e-6; a group whose std
   is at most 1e-6 gets 0) or ``asym_clip`` (``mean_std`` clipped to [-1, 3]);
2. normalised again by ``algorithm.reward_norm`` (ROLL's RLVR ``reward_postprocess``): ``batch`` /
   ``group`` (mean, and std unless ``reward_shift``), or ``running`` (running moments over steps;
   ``reward_shift``: subtract the mean only, ``reward_scale``: divide by the std only);
3. clipped to ``[-reward_clip, reward_clip]``.

When any of these is on, the shaped score replaces the row's token rewards, placed on its last
sampled token (ROLL's response-level reward; turn rewards are folded into it, as ROLL does with
``use_turn_scores`` off). After the estimator (``postprocess_advantages``): ``whiten_advantages``
whitens over the batch's sampled tokens, then ``advantage_clip`` clips.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from agentgym.trainer.algos.advantages import group_rows
from agentgym.trainer.algos.stats import masked_whiten

Tensor = torch.Tensor

GROUPINGS = ("state", "batch", "inductive")
METHODS = ("identity", "mean", "mean_std", "asym_clip")


def normalize_group(scores: Tensor, method: str) -> Tensor:
    """One group's scores under ``method`` (ROLL's ``get_score_normalize_fn``)."""
    if method == "identity":
        return scores
    centred = scores - scores.mean()
    if method == "mean":
        return centred
    std = scores.std() if scores.numel() > 1 else torch.zeros((), dtype=scores.dtype)
    if not bool(std.abs() > 1e-6):  # a flat group (or one trajectory): nothing to learn from
        return torch.zeros_like(scores)
    normalized = centred / (std + 1e-6)
    return normalized.clamp(-1, 3) if method == "asym_clip" else normalized


def normalize_scores(
    scores: Tensor, groups: Sequence[Hashable], tags: Sequence[Hashable], grouping: str, method: str
) -> Tensor:
    """Scores normalised per group of ``grouping`` (``state``: ``groups``, ``inductive``: ``tags``)."""
    if grouping not in GROUPINGS:
        raise ValueError(f"reward_normalization.grouping must be one of {GROUPINGS}, got {grouping!r}")
    if method not in METHODS:
        raise ValueError(f"reward_normalization.method must be one of {METHODS}, got {method!r}")
    keys = {"state": list(groups), "inductive": list(tags), "batch": [0] * scores.shape[0]}[grouping]
    out = scores.clone()
    for rows in group_rows(keys, scores.shape[0]).values():
        index = torch.tensor(rows)
        out[index] = normalize_group(scores[index], method)
    return out


class RunningMoments:
    """Running mean and std of every score seen (ROLL's ``reward_norm=running``; Chan et al.'s update)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: Tensor) -> None:
        n = values.numel()
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_m2 = float(((values - batch_mean) ** 2).sum())
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return (self.m2 / (self.count - 1)) ** 0.5 if self.count > 1 else 1.0


def reward_norm(
    scores: Tensor,
    groups: Sequence[Hashable],
    mode: str | None,
    shift: bool = False,
    scale: bool = False,
    running: RunningMoments | None = None,
) -> Tensor:
    """ROLL's ``reward_norm``: ``batch`` / ``group`` normalise over the batch / each group (mean only
    with ``shift``); ``running`` uses ``running`` moments, updated with these scores first."""
    if mode is None:
        return scores
    if mode == "running":
        if running is None:
            raise ValueError("reward_norm=running needs the running moments")
        running.update(scores)
        std = running.std + torch.finfo(scores.dtype).eps
        if shift:
            return scores - running.mean
        if scale:
            return scores / std
        return (scores - running.mean) / std
    keys = [0] * scores.shape[0] if mode == "batch" else list(groups)
    out = scores.clone()
    for rows in group_rows(keys, scores.shape[0]).values():
        index = torch.tensor(rows)
        group = scores[index]
        centred = group - group.mean()
        std = group.std() if len(rows) > 1 else torch.ones((), dtype=scores.dtype)
        out[index] = centred if shift else centred / (std + 1e-6)
    return out


def shaping_enabled(method: str, mode: str | None, clip: float | None) -> bool:
    return method != "identity" or mode is not None or bool(clip)


def shape_rewards(
    token_level_scores: Tensor,
    response_mask: Tensor,
    groups: Sequence[Hashable],
    tags: Sequence[Hashable],
    *,
    grouping: str = "state",
    method: str = "identity",
    reward_norm_mode: str | None = None,
    reward_shift: bool = False,
    reward_scale: bool = False,
    reward_clip: float | None = None,
    running: RunningMoments | None = None,
    valid: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The token rewards with ROLL's shaping applied (see the module docstring) and its metrics.
    Rows not ``valid`` (untrainable, padding) are left out of every statistic and keep 0."""
    if not shaping_enabled(method, reward_norm_mode, reward_clip):
        return token_level_scores, {}
    keep = valid if valid is not None else torch.ones(token_level_scores.shape[0], dtype=torch.bool)
    rows = torch.nonzero(keep).flatten().tolist()
    scores = token_level_scores.sum(-1)[rows]
    picked_groups = [groups[r] for r in rows]
    shaped = normalize_scores(scores, picked_groups, [tags[r] for r in rows], grouping, method)
    shaped = reward_norm(shaped, picked_groups, reward_norm_mode, reward_shift, reward_scale, running)
    metrics: dict[str, float] = {}
    if reward_clip:
        metrics["critic/reward_clip_frac"] = float((shaped.abs() > reward_clip).float().mean()) if rows else 0.0
        shaped = shaped.clamp(-reward_clip, reward_clip)
    out = torch.zeros_like(token_level_scores)
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(-1).values
    for value, row in zip(shaped.tolist(), rows):
        if last[row] >= 0:
            out[row, last[row]] = value
    return out, metrics


def postprocess_advantages(
    advantages: Tensor, response_mask: Tensor, whiten: bool = False, clip: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """ROLL's ``whiten_advantages`` (over the batch's sampled tokens) then ``advantage_clip``."""
    metrics: dict[str, float] = {}
    mask = response_mask.to(advantages.dtype)
    if whiten and response_mask.sum() > 1:
        advantages = masked_whiten(advantages, response_mask) * mask
    if clip:
        picked = advantages[response_mask.bool()]
        metrics["critic/advantage_clip_frac"] = float((picked.abs() > clip).float().mean()) if picked.numel() else 0.0
        advantages = advantages.clamp(-clip, clip) * mask
    return advantages, metrics
