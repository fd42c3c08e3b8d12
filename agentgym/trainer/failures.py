"""What the trainer does when a step's rollouts fail, or come back from old weights.

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
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from typing import Any

from agentgym.types import Trajectory


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
