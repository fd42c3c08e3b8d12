"""Advantage estimators, keyed by ``algorithm.adv_estimator`` (veRL ``core_algos``'s
``ADV_ESTIMATOR_REGISTRY``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from agentgym.trainer.algos.stats import masked_whiten, unknown_name

Tensor = torch.Tensor


# ---- advantage estimators ------------------------------------------------------------

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {}
"""``algorithm.adv_estimator`` name -> estimator; each returns ``(advantages, returns)``."""


def _register_adv_est(name: str):
    def decorator(fn):
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """The estimator registered as ``name``. Mirrors veRL ``core_algos.get_adv_estimator_fn``."""
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise unknown_name("algorithm.adv_estimator", name, list(ADV_ESTIMATOR_REGISTRY))
    return ADV_ESTIMATOR_REGISTRY[name]


def group_rows(index: Any, batch_size: int) -> dict[Hashable, list[int]]:
    """Row numbers of each group, in order of first appearance; ``index[i]`` is row i's
    group id (veRL's ``uid``: a list, a numpy array or a tensor)."""
    ids = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    if len(ids) != batch_size:
        raise ValueError(f"index has {len(ids)} group ids for a batch of {batch_size} rows")
    groups: dict[Hashable, list[int]] = {}
    for row, group_id in enumerate(ids):
        groups.setdefault(group_id, []).append(row)
    return groups


def scores_equal(values: Sequence[float]) -> bool:
    """Whether a group's scores are equal up to float rounding: their spread is at most 1e-6 of
    their magnitude (of 1, for scores below 1)."""
    return max(values) - min(values) <= 1e-6 * max(1.0, max(abs(v) for v in values))


@_register_adv_est("gae")
def compute_gae_advantage_return(
    token_level_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation over the sampled tokens.

    Mirrors veRL ``core_algos.compute_gae_advantage_return`` in its multi-turn form (veRL PR
    #2337): scanning right to left, a token with mask 0 (observation or padding) passes the
    next sampled token's value and advantage through unchanged. So GAE runs on the
    sampled tokens alone, as if the observations between turns were not there; a reward or
    value placed on a mask-0 token is ignored, and a mask-0 position reports the advantage
    of the next sampled token (0 after the last one).

    Returns ``(advantages, returns)``: ``returns = raw advantages + values`` (every position),
    and the advantages whitened with ``masked_whiten`` over ``response_mask``.
    """
    with torch.no_grad():
        mask = response_mask.bool()
        next_value = torch.zeros_like(values[:, 0])
        last_gae = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae_t = delta + gamma * lam * last_gae
            next_value = torch.where(mask[:, t], values[:, t], next_value)
            last_gae = torch.where(mask[:, t], gae_t, last_gae)
            advantages[:, t] = last_gae
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@_register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO: each response's outcome score normalised within its group.

    Mirrors veRL ``core_algos.compute_grpo_outcome_advantage``. The score is the sum of the
    row's token rewards; rows sharing ``index[i]`` (veRL's ``uid``) form a group;
    ``advantage = (score - mean) / (std + epsilon)`` with the unbiased std of the group. A group
    of one has mean 0 and std 1 (its advantage is its score / (1 + epsilon)).
    ``norm_adv_by_std_in_grpo=False`` is Dr.GRPO: ``score - mean`` without the division.

    One departure from veRL: a group whose scores are equal up to float rounding (spread at most
    1e-6 of their magnitude) gets advantage 0. Dividing rounding noise by ``std + epsilon`` gives
    advantages up to about 0.5 for equal float32 scores near 10, a push in a random direction.

    Returns ``(advantages, returns)``, equal, broadcast over the row and multiplied by the mask.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = torch.zeros_like(scores)
        for rows in group_rows(index, scores.shape[0]).values():
            rows_t = torch.tensor(rows, device=scores.device)
            group = scores[rows_t]
            if len(rows) == 1:
                mean, std = torch.zeros_like(group[0]), torch.ones_like(group[0])
            else:
                mean, std = group.mean(), group.std()
                if scores_equal(group.tolist()):
                    continue  # equal scores: advantage 0, not rounding noise / epsilon
            if norm_adv_by_std_in_grpo:
                advantages[rows_t] = (group - mean) / (std + epsilon)
            else:
                advantages[rows_t] = group - mean
        advantages = advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)
    return advantages, advantages


@_register_adv_est("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any, epsilon: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """RLOO: each response's score minus the mean score of the *other* responses in its group.

    Mirrors veRL ``core_algos.compute_rloo_outcome_advantage``, computed as veRL does:
    ``score * n / (n - 1) - group_mean * n / (n - 1)``. A group of one has no other responses
    and keeps its raw score. ``epsilon`` is unused (kept for veRL's signature).

    Returns ``(advantages, returns)``, equal, broadcast over the row and multiplied by the mask.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = scores.clone()
        for rows in group_rows(index, scores.shape[0]).values():
            n = len(rows)
            if n > 1:
                rows_t = torch.tensor(rows, device=scores.device)
                group = scores[rows_t]
                advantages[rows_t] = group * n / (n - 1) - group.mean() * n / (n - 1)
        advantages = advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)
    return advantages, advantages


@_register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted reward-to-go per token, whitened over the batch.

    Mirrors veRL ``core_algos.compute_reinforce_plus_plus_outcome_advantage`` in its
    multi-turn form (veRL PR #7300, fixing issue #7278): scanning right to left, sampled
    tokens take ``return = reward + gamma * running_return``; mask-0 tokens (observations,
    padding) carry the running return through unchanged, so an outcome reward reaches every
    earlier turn. As with ``gae``, rewards on mask-0 tokens are ignored. ``gamma`` is veRL's
    ``algorithm.gamma``.

    Returns ``(advantages, returns)``: returns are 0 on mask-0 tokens; advantages are the
    returns whitened with ``masked_whiten`` and multiplied by the mask.
    """
    with torch.no_grad():
        mask = response_mask.bool()
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            candidate = token_level_rewards[:, t] + gamma * running
            running = torch.where(mask[:, t], candidate, running)
            returns[:, t] = torch.where(mask[:, t], candidate, torch.zeros_like(candidate))
        advantages = masked_whiten(returns, response_mask) * response_mask.to(returns.dtype)
    return advantages, returns


@_register_adv_est("reinforce")
def compute_reinforce_return(
    token_level_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """REINFORCE: each sampled token's discounted reward-to-go, with no baseline and no whitening.

    ROLL's ``adv_estimator: reinforce`` (and its agentic ``grpo``, whose group baseline comes from
    ``algorithm.reward_normalization``): ``compute_reinforce_return``. Mask-0 tokens carry the running
    return through unchanged and get 0 (as ``reinforce_plus_plus``; ROLL also discounts across
    observation positions, which matters only with ``gamma < 1``).

    Returns ``(advantages, returns)``, equal.
    """
    with torch.no_grad():
        mask = response_mask.bool()
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            candidate = token_level_rewards[:, t] + gamma * running
            running = torch.where(mask[:, t], candidate, running)
            returns[:, t] = torch.where(mask[:, t], candidate, torch.zeros_like(candidate))
    return returns, returns


@_register_adv_est("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any, epsilon: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline: score minus its group's mean, broadcast over the row, whitened.

    Mirrors veRL ``core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage``: the
    score is the row's reward sum; a group of one has mean 0; the centred score is tiled over
    the row, masked, whitened over the whole batch with ``masked_whiten`` and masked again.
    ``epsilon`` is unused (kept for veRL's signature).

    Returns ``(advantages, returns)``, equal.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        centred = scores.clone()
        for rows in group_rows(index, scores.shape[0]).values():
            if len(rows) > 1:
                rows_t = torch.tensor(rows, device=scores.device)
                centred[rows_t] = scores[rows_t] - scores[rows_t].mean()
        mask = response_mask.to(scores.dtype)
        tiled = centred.unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * mask
        advantages = masked_whiten(tiled, mask) * mask
    return advantages, advantages


def compute_advantage(adv_estimator: str, **inputs: Any) -> tuple[Tensor, Tensor]:
    """Run the estimator named by ``algorithm.adv_estimator`` on whichever of ``inputs`` it takes.

    The inputs are veRL's names: ``token_level_rewards``, ``response_mask``, ``values`` (gae),
    ``index`` (the group ids: grpo, rloo, reinforce_plus_plus_baseline), ``gamma``, ``lam``,
    ``norm_adv_by_std_in_grpo``, ``epsilon``. Inputs an estimator does not take are left
    out, so a trainer can pass the whole set; one it needs but lacks is an error that names it.
    Plays the part of veRL ``ray_trainer.compute_advantage`` without the ``DataProto``.
    """
    fn = get_adv_estimator_fn(adv_estimator)
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in inputs.items() if k in params and v is not None}
    missing = [
        name for name, p in params.items() if p.default is inspect.Parameter.empty and name not in kwargs
    ]
    if missing:
        raise ValueError(
            f"adv_estimator {adv_estimator!r} needs {', '.join(missing)}; "
            f"got {', '.join(sorted(k for k, v in inputs.items() if v is not None)) or 'nothing'}"
        )
    return fn(**kwargs)
