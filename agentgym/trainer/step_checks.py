"""What the trainer checks in a step's trajectories: can it train on them, and will it learn anything?

**Failed episodes.** Each model call is already retried by ``PolicyClient`` (``max_retries``, with
backoff) before an episode fails. A step where more than ``trainer.max_failed_episode_frac`` of the
episodes failed stops the run with ``TrainingFailed``: its message gives the count, the commonest
failure and the policy servers that do not answer ``/health`` (``agentgym train`` exits 1). Before,
a dead server made every step log "failed: 16; skipping the update" and the run end "done" with
exit code 0.

**Stale samples.** The synchronous trainer trains only on what the current weights sampled (the
asynchronous one allows a bounded lag and enforces it itself, ``async_training.staleness_threshold``): at step
``s`` every turn must carry weight version ``s - 1`` (the version pushed after step ``s - 1``, or
at resume). A turn with an older version means a server lost the pushed weights (it restarted and
serves its initial ones, version 0). The choice made: such trajectories are refused (status
``failed``, never trained on, counted as ``rollout/stale_episodes``), and the current weights are
pushed to every server again at once, so the next step samples from them.

**Flat rewards.** Groups whose trajectories all scored the same get advantage zero. The trainer
counts them every step (``batch/zero_variance_group_frac``) and warns once per run
when a whole step is flat (nothing is learned from it), saying what to try instead.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentgym.trainer import algos
from agentgym.types import Trajectory

# ---- failed episodes and stale samples ---------------------------------------------------------------


class TrainingFailed(RuntimeError):
    """The run cannot go on (its rollouts keep failing); the message says why and what to check."""


def failed_episode_check(
    trajectories: Sequence[Trajectory], step: int, max_frac: float, dead_servers: Sequence[str] = ()
) -> dict[str, float]:
    """``rollout/failed_episode_frac``; raises ``TrainingFailed`` when it is over ``max_frac``."""
    if not trajectories:
        return {}
    failed = [t for t in trajectories if t.status == "failed"]
    frac = len(failed) / len(trajectories)
    if frac <= max_frac:
        return {"rollout/failed_episode_frac": frac}
    reasons = collections.Counter(_reason(t.failure or "") for t in failed)
    reason, count = reasons.most_common(1)[0]
    where = f" Not answering /health: {', '.join(dead_servers)}." if dead_servers else ""
    raise TrainingFailed(
        f"step {step}: {len(failed)} of {len(trajectories)} episodes failed, more than "
        f"trainer.max_failed_episode_frac={max_frac:g}; stopping the run.{where} Commonest failure "
        f"({count} of {len(failed)}): {reason}. Fix the cause and run the same command again to resume from "
        f"the last checkpoint (or raise trainer.max_failed_episode_frac to tolerate more failures)."
    )


def _reason(failure: str) -> str:
    """A failure message with its per-episode details (numbers, ids) blurred, so equal causes group."""
    return re.sub(r"\b[0-9a-f]{8,}\b", "…", failure)[:400]


def stale_trajectories(trajectories: Sequence[Trajectory], expected_version: int) -> list[Trajectory]:
    """Trajectories with a turn sampled by weights older than ``expected_version``."""
    return [t for t in trajectories if any(turn.weight_version < expected_version for turn in t.turns)]


def refuse_stale(stale: Sequence[Trajectory], expected_version: int) -> str:
    """Mark ``stale`` trajectories failed (never trained on); returns a warning naming what happened."""
    versions = sorted(
        {turn.weight_version for t in stale for turn in t.turns if turn.weight_version < expected_version}
    )
    for traj in stale:
        traj.status = "failed"
        traj.failure = (
            f"stale: sampled by weight version {min(versions)}, the trainer is at version "
            f"{expected_version} (did a policy server restart?); not trained on"
        )
    return (
        f"{len(stale)} trajectories were sampled by weight version(s) {versions} although the servers were "
        f"sent version {expected_version}: a policy server lost its weights (restarted?). They are not "
        f"trained on, and the current weights are pushed to every server again."
    )


async def dead_servers(client: Any) -> list[str]:
    """The URLs of ``client``'s servers that do not answer ``/health`` (none if it cannot tell)."""
    try:
        healthy = await client.health()
    except Exception:  # noqa: BLE001 - a diagnosis, never a new failure
        return []
    return [s.url for s, ok in zip(client.servers, healthy) if not ok]


# ---- flat rewards --------------------------------------------------------------------------------------

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
