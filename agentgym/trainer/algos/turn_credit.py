"""Turn-level credit for multi-turn episodes: GiGPO (Feng et al. 2025, "Group-in-Group Policy
Optimization for LLM Agent Training"), as verl-agent and ROLL compute it, on agentgym's one-row-per-
episode layout.

GRPO gives every turn of an episode the same advantage, the episode's score against its group. In
a multi-turn env the later turns then carry mostly blame: episodes that are solved early stop
early, so the states that come up at turn 2 or 3 come up almost only in episodes that fail, and
every reply there is pushed down, good or bad. GiGPO adds a step-level advantage that compares a
turn only with turns of the same task that faced the *same state*: each turn's discounted return
from there on (``algorithm.gamma``), normalised within its step group. A turn's advantage is

    episode_advantage_w * A_episode  +  step_advantage_w * A_step(turn)

``step_grouping`` says what "the same state" is: ``state`` (GiGPO: equal ``Turn.state_key``, the
env's state or a hash of the observation the model answered) or ``turn`` (the episodes of the group
that reached the same turn number: a coarser baseline that always has company). Both are
baselines that depend only on what happened before the turn, so they do not bias the gradient.

Rows are episodes; ``turn_index[i, t]`` is the turn (0-based) of sampled token t of row i, -1 on
observation tokens and padding; ``step_keys[i][k]`` is row i's state key at turn k. A turn's
reward is the sum of its tokens' rewards (the turn reward sits on its last sampled token, the
outcome on the episode's last one), so returns follow ``token_level_rewards`` exactly.

Normalisation (``mode``): ``mean_std_norm`` (score - mean) / (std + epsilon), ``mean_norm`` score -
mean. As in ROLL's ``grouped_reward_norm``, a group of one, or one whose scores are equal, gets 0
(verl-agent keeps a lone step's raw return; here a step with nothing to compare against teaches
nothing, which is what stops the blame at turns only failures reach).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from agentgym.trainer.algos.advantages import _register_adv_est, group_rows, scores_equal
from agentgym.trainer.algos.stats import unknown_name

Tensor = torch.Tensor

GIGPO_MODES = ("mean_std_norm", "mean_norm")
STEP_GROUPINGS = ("state", "turn")


def normalise_in_groups(
    values: Sequence[float], keys: Sequence[Hashable], mode: str = "mean_std_norm", epsilon: float = 1e-6
) -> list[float]:
    """Each value against the others sharing its key; 0 for a key held by one value or by equal values."""
    if mode not in GIGPO_MODES:
        raise unknown_name("algorithm.gigpo.mode", mode, list(GIGPO_MODES))
    out = [0.0] * len(values)
    for rows in group_rows(list(keys), len(values)).values():
        group = [values[r] for r in rows]
        if len(rows) < 2 or scores_equal(group):
            continue
        t = torch.tensor(group, dtype=torch.float64)
        centred = t - t.mean()
        if mode == "mean_std_norm":
            centred = centred / (t.std() + epsilon)
        for r, v in zip(rows, centred.tolist()):
            out[r] = v
    return out


def turn_returns(token_level_rewards: Tensor, turn_index: Tensor, gamma: float) -> list[list[float]]:
    """Each row's discounted return from each of its turns: ``G_k = sum_{u >= k} gamma^(u-k) R_u``."""
    out: list[list[float]] = []
    for rewards, turns in zip(token_level_rewards.tolist(), turn_index.tolist()):
        count = max(turns, default=-1) + 1
        per_turn = [0.0] * count
        for r, k in zip(rewards, turns):
            if k >= 0:
                per_turn[k] += r
        running = 0.0
        returns = [0.0] * count
        for k in reversed(range(count)):
            running = per_turn[k] + gamma * running
            returns[k] = running
        out.append(returns)
    return out


@_register_adv_est("gigpo")
def compute_gigpo_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    turn_index: Tensor,
    step_keys: Sequence[Sequence[str]] | None = None,
    gamma: float = 1.0,
    step_advantage_w: float = 1.0,
    episode_advantage_w: float = 1.0,
    mode: str = "mean_std_norm",
    step_grouping: str = "state",
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GiGPO advantages: the episode's score against its group plus each turn's return against the
    turns of its group that faced the same state (see the module docstring).

    Returns ``(advantages, returns)``, equal; each sampled token carries its turn's advantage.
    """
    if step_grouping not in STEP_GROUPINGS:
        raise unknown_name("algorithm.gigpo.step_grouping", step_grouping, list(STEP_GROUPINGS))
    ids = index.tolist() if isinstance(index, Tensor) else list(index)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1).tolist()
        episode = normalise_in_groups(scores, ids, mode, epsilon)
        returns = turn_returns(token_level_rewards, turn_index, gamma)
        flat_values: list[float] = []
        flat_keys: list[tuple[Hashable, Hashable]] = []
        where: list[tuple[int, int]] = []
        for row, row_returns in enumerate(returns):
            for k, value in enumerate(row_returns):
                if step_grouping == "turn":
                    key: Hashable = k
                else:
                    keys = step_keys[row] if step_keys is not None else ()
                    key = keys[k] if k < len(keys) and keys[k] else ("row", row, k)  # unknown state: alone
                flat_values.append(value)
                flat_keys.append((ids[row], key))
                where.append((row, k))
        step = normalise_in_groups(flat_values, flat_keys, mode, epsilon)
        per_turn = torch.zeros(
            len(returns),
            max((len(r) for r in returns), default=0) + 1,
            dtype=token_level_rewards.dtype,
            device=token_level_rewards.device,
        )
        for (row, k), value in zip(where, step):
            per_turn[row, k] = episode_advantage_w * episode[row] + step_advantage_w * value
        # padding and observation tokens (turn -1) read the spare last column, which stays 0
        column = torch.where(turn_index >= 0, turn_index, torch.full_like(turn_index, per_turn.shape[1] - 1))
        advantages = torch.gather(per_turn, 1, column.long()) * response_mask.to(per_turn.dtype)
    return advantages, advantages
