"""Flat rewards: groups whose trajectories all scored the same, so their advantages are zero.

The trainer counts them every step (``batch/zero_variance_group_frac``) and warns once per run
when a whole step is flat (nothing is learned from it), saying what to try instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from agentgym.trainer import algos

GROUP_RELATIVE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")
"""Estimators whose advantage is a trajectory's reward against its own group's: a group whose
rewards are all equal gives every one of its trajectories advantage 0."""

FLAT_ATOL = 1e-6
"""Advantages closer to zero than this count as zero (and rewards this close, as one value in the warning)."""


@dataclass(frozen=True)
class GroupRewardSpread:
    """How rewards spread within the groups of a batch (rows sharing a group id).

    ``groups`` counts the groups with at least two trainable trajectories (a group of one has
    no spread to speak of; those are ``singletons``); ``flat`` counts the groups among them
    whose trajectories all got the same reward; ``low`` / ``high`` are the smallest and
    largest of the flat groups' rewards (None when no group is flat).
    """

    groups: int = 0
    flat: int = 0
    singletons: int = 0
    low: float | None = None
    high: float | None = None

    @property
    def zero_variance_frac(self) -> float | None:
        """``batch/zero_variance_group_frac``: the share of groups with zero reward variance."""
        return self.flat / self.groups if self.groups else None

    @property
    def all_flat(self) -> bool:
        return self.groups > 0 and self.flat == self.groups


def group_reward_spread(
    scores: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable],
    valid: Sequence[bool] | torch.Tensor | None = None,
) -> GroupRewardSpread:
    """Group the trajectory-level rewards ``scores`` (one per row) by ``group_ids`` (the batch's
    ``uid``), leaving out rows that are not ``valid``, and count the groups whose rewards are
    all equal (``algos.scores_equal``: the rule by which GRPO gives such a group advantage 0)."""
    values = scores.tolist() if isinstance(scores, torch.Tensor) else list(scores)
    keep = (
        [True] * len(values)
        if valid is None
        else [bool(v) for v in (valid.tolist() if isinstance(valid, torch.Tensor) else valid)]
    )
    if len(keep) != len(values):
        raise ValueError(f"{len(values)} rewards and {len(keep)} valid flags")
    groups = flat = singletons = 0
    flat_values: list[float] = []
    for rows in algos.group_rows(group_ids, len(values)).values():
        rewards = [float(values[r]) for r in rows if keep[r]]
        if not rewards:
            continue
        if len(rewards) < 2:
            singletons += 1
            continue
        groups += 1
        if algos.scores_equal(rewards):
            flat += 1
            flat_values.append(rewards[0])
    return GroupRewardSpread(groups, flat, singletons, min(flat_values, default=None), max(flat_values, default=None))


def advantages_vanish(
    spread: GroupRewardSpread,
    adv_estimator: str,
    advantages: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    atol: float = FLAT_ATOL,
) -> bool:
    """True when every group got identical rewards and the advantages are therefore zero: the
    estimator is group-relative and no trajectory stands in a group of its own, or every
    advantage on a sampled token is in fact (within ``atol``) zero."""
    if not spread.all_flat:
        return False
    if adv_estimator in GROUP_RELATIVE_ESTIMATORS and spread.singletons == 0:
        return True
    if advantages is None:
        return False
    picked = advantages[mask.bool()] if mask is not None else advantages.flatten()
    return picked.numel() == 0 or float(picked.abs().max()) <= atol


def flat_rewards_warning(
    spread: GroupRewardSpread, step: int, model_path: str, env_name: str | None, n: int, temperature: float
) -> str:
    """The once-per-run warning for a step where every group got identical rewards."""
    if spread.low is not None and spread.high is not None and spread.high - spread.low <= FLAT_ATOL:
        value = f"value {spread.low:g} for every trajectory"
    else:
        value = f"the same value within each group, from {spread.low:g} to {spread.high:g}"
    lines = [
        f"step {step}: all {spread.groups} groups got identical rewards ({value}), so every advantage "
        f"is zero: the policy-gradient update is zero and the policy learns nothing from this step."
    ]
    if model_path == "tiny":
        lines.append(
            "  With the built-in tiny random model (actor_rollout_ref.model.path=tiny) this is expected: "
            "it almost never writes a reply the env rewards. To see learning, try:"
        )
    else:
        lines.append(
            f"  The model ({model_path}) scores the same on every try of a task: the task is too hard "
            f"(or too easy) for it. To get a learning signal, try:"
        )
    if env_name != "first_letter":
        lines.append("    agentgym train --env first_letter   (a task the tiny model learns in a few steps)")
    lines.append(
        "    a real model: model=qwen2.5-0.5b, or actor_rollout_ref.model.path=<HF model dir or hub name>"
        if model_path == "tiny"
        else "    a stronger model: actor_rollout_ref.model.path=<HF model dir or hub name>"
    )
    lines.append(
        f"    more varied replies: raise actor_rollout_ref.rollout.n (now {n}) or "
        f"actor_rollout_ref.rollout.temperature (now {temperature:g})"
    )
    lines.append("  (warned once per run; the metric batch/zero_variance_group_frac tracks it every step)")
    return "\n".join(lines)
