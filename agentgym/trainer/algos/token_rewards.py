"""Turn-level credit: rewards from ``Trajectory`` objects onto tokens, in veRL's layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agentgym.types import Trajectory

Tensor = torch.Tensor


# ---- turn-level credit: rewards onto tokens ------------------------------------------


def token_level_scores_from_rewards(token_rewards: Sequence[Sequence[float]], response_mask: Tensor) -> Tensor:
    """Build veRL's ``token_level_scores`` ``(batch, seq)`` from per-token reward lists.

    Row i of ``token_rewards`` lines up with row i of ``response_mask`` (it may be shorter:
    the rest is padding). A reward must sit on a sampled token, because the estimators
    (``gae``, ``reinforce_plus_plus``) ignore rewards on mask-0 tokens; so a non-zero reward
    found on an observation or padding token is moved to the nearest *earlier* sampled token
    of its row (the action the observation answers), or to the first sampled token when
    none precedes it. A row with a non-zero reward and no sampled token is an error.
    """
    batch, seq = response_mask.shape
    if len(token_rewards) != batch:
        raise ValueError(f"got {len(token_rewards)} reward rows for a batch of {batch}")
    mask = response_mask.bool().tolist()
    rows = []
    for i, rewards in enumerate(token_rewards):
        if len(rewards) > seq:
            raise ValueError(f"row {i} has {len(rewards)} token rewards for {seq} positions")
        row = [0.0] * seq
        sampled = [t for t in range(seq) if mask[i][t]]
        for t, reward in enumerate(rewards):
            if reward == 0:
                continue
            if not mask[i][t]:
                if not sampled:
                    raise ValueError(f"row {i} has a reward at position {t} but no sampled token to carry it")
                earlier = [s for s in sampled if s < t]
                t = earlier[-1] if earlier else sampled[0]
            row[t] += float(reward)
        rows.append(row)
    dtype = response_mask.dtype if response_mask.is_floating_point() else torch.float32
    return torch.tensor(rows, dtype=dtype, device=response_mask.device).reshape(batch, seq)


def trajectories_to_token_rewards(
    trajectories: Sequence[Trajectory],
    turn_reward_coef: float = 1.0,
    outcome_reward_coef: float = 1.0,
    response_length: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(token_level_scores, response_mask)`` for a batch of trajectories, in veRL's layout.

    Each row is a trajectory's response region (from the first sampled token: everything
    after ``Trajectory.prompt_length()``) right-padded to ``response_length`` (default: the
    longest). Rewards come from ``Trajectory.token_rewards(turn_reward_coef,
    outcome_reward_coef)`` (each turn's reward on its last sampled token, the outcome reward
    on the episode's last one), the mask from ``Trajectory.loss_mask()``. A trajectory longer
    than ``response_length`` is an error (truncate it in the rollout, where the tokens are), and
    so is one that is not ``trainable`` (failed episodes are kept for inspection, not trained on).
    """
    masks, rewards = [], []
    for i, traj in enumerate(trajectories):
        if not traj.trainable:
            raise ValueError(
                f"trajectory {i} is not trainable (status={traj.status!r}, {traj.num_turns} turns); "
                "filter the batch with Trajectory.trainable first"
            )
        start = traj.prompt_length()
        masks.append(traj.loss_mask()[start:])
        rewards.append(traj.token_rewards(turn_reward_coef, outcome_reward_coef)[start:])
    longest = max((len(m) for m in masks), default=0)
    width = longest if response_length is None else response_length
    if longest > width:
        raise ValueError(f"a trajectory's response region has {longest} tokens, more than response_length={width}")
    response_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    response_mask = response_mask.reshape(len(masks), width)
    return token_level_scores_from_rewards(rewards, response_mask), response_mask
