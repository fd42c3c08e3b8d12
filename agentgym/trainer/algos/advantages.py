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


def discounted_returns(token_level_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Each sampled token's discounted reward-to-go over the sampled tokens alone.

    Scanning right to left, a sampled token takes ``reward + gamma * running``; a mask-0 token
    (observation, padding) carries the running return through unchanged, so an outcome reward
    reaches every earlier turn, and gets 0. Rewards on mask-0 tokens are ignored. The return both
    ``reinforce`` and ``reinforce_plus_plus`` start from (GiGPO's per-turn return is
    ``turn_credit.turn_returns``).
    """
    with torch.no_grad():
        mask = response_mask.bool()
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            candidate = token_level_rewards[:, t] + gamma * running
            running = torch.where(mask[:, t], candidate, running)
            returns[:, t] = torch.where(mask[:, t], candidate, torch.zeros_like(candidate))
    return returns


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
        returns = discounted_returns(token_level_rewards, response_mask, gamma)
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
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
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


@_register_adv_est("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: Tensor, reward_baselines: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023): each sampled token's reward-to-go minus the score of a greedy reply to
    the same task.

    Mirrors veRL ``core_algos.compute_remax_outcome_advantage``: ``returns`` is the reverse cumulative
    sum of the masked token rewards, ``advantages = returns - reward_baselines * mask``; no
    whitening. ``reward_baselines`` (one per row) is the greedy episode's score, which the
    trajectory source rolls out beside the sampled ones (``agentgym.rollout.sources``, as veRL's
    trainer generates its ``gen_baseline_batch`` with ``do_sample=False``).

    Returns ``(advantages, returns)``.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = returns - reward_baselines.to(returns.dtype).unsqueeze(-1) * mask
    return advantages, returns


@_register_adv_est("opo")
def compute_opo_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any
) -> tuple[Tensor, Tensor]:
    """OPO (Hao et al. 2025, on-policy RL with the optimal baseline): score minus its group's
    length-weighted mean score.

    Mirrors veRL ``core_algos.compute_opo_outcome_advantage``: the baseline of a group is
    ``sum(len_i * score_i) / sum(len_i)`` with ``len_i`` the row's sampled tokens; a group of one has
    baseline 0. The centred score is broadcast over the row and masked.

    Returns ``(advantages, returns)``, equal.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        centred = scores.clone()
        for rows in group_rows(index, scores.shape[0]).values():
            if len(rows) > 1:
                rows_t = torch.tensor(rows, device=scores.device)
                weights = lengths[rows_t]
                baseline = (weights * scores[rows_t]).sum() / weights.sum().clamp(min=1e-8)
                centred[rows_t] = scores[rows_t] - baseline
        advantages = centred.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@_register_adv_est("grpo_passk")
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """Pass@k training (Chen et al. 2025): only the best reply of each group learns, by how much it
    beats the second best.

    Mirrors veRL ``core_algos.compute_grpo_passk_outcome_advantage``: in each group the row with the
    highest score gets ``r_max - r_second_max`` (divided by ``std + epsilon`` of the group's scores
    when ``norm_adv_by_std_in_grpo``); every other row gets 0. Ties go to the first such row. A group
    of one is refused, as in veRL (pass@k compares replies).

    Returns ``(advantages, returns)``, equal, broadcast over the row and multiplied by the mask.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = torch.zeros_like(scores)
        for group_id, rows in group_rows(index, scores.shape[0]).items():
            if len(rows) < 2:
                raise ValueError(
                    f"grpo_passk needs at least 2 replies per task (actor_rollout_ref.rollout.n >= 2); "
                    f"group {group_id!r} has {len(rows)}"
                )
            rows_t = torch.tensor(rows, device=scores.device)
            group = scores[rows_t]
            top, top_index = torch.topk(group, 2)
            advantage = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                advantage = advantage / (group.std() + epsilon)
            advantages[rows[int(top_index[0])]] = advantage
        advantages = advantages.unsqueeze(-1) * response_mask.to(advantages.dtype)
    return advantages, advantages


@_register_adv_est("gpg")
def compute_gpg_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any, f_norm: float = 1.0
) -> tuple[Tensor, Tensor]:
    """GPG (Chu et al. 2025, group policy gradient): score minus its group's mean, scaled up by the
    share of rows with a non-zero score.

    Mirrors veRL ``core_algos.compute_gpg_outcome_advantage``: ``alpha = rows / max(1, rows with a
    non-zero score)`` over the whole batch, ``advantage = alpha * (score - group mean) / f_norm``
    (a group of one has mean 0), broadcast over the row and masked. veRL pairs it with
    ``actor.policy_loss.loss_mode=gpg`` (no ratio, no clip).

    Returns ``(advantages, returns)``, equal.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
        centred = scores.clone()
        for rows in group_rows(index, scores.shape[0]).values():
            if len(rows) > 1:
                rows_t = torch.tensor(rows, device=scores.device)
                centred[rows_t] = scores[rows_t] - scores[rows_t].mean()
        advantages = (alpha * centred / f_norm).unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


def reward_baselines_of(trajectories: Sequence[Any], rows: int) -> Tensor:
    """The greedy baseline score of each batch row (``Trajectory.metrics["reward_baseline"]``, written by
    the trajectory source for ``remax``); rows past the trajectories (padding) get 0. Raises when a
    trajectory has none: its source rolled out no greedy baseline."""
    missing = [i for i, t in enumerate(trajectories) if "reward_baseline" not in t.metrics]
    if missing:
        raise ValueError(
            f"algorithm.adv_estimator=remax needs a greedy baseline episode per task, and {len(missing)} of "
            f"{len(trajectories)} trajectories have none: the baseline is rolled out by env runs (--env, "
            f"data.train_files); an --agent run or several env tags cannot use remax (try grpo or rloo)"
        )
    values = [float(t.metrics["reward_baseline"]) for t in trajectories]
    return torch.tensor(values + [0.0] * (rows - len(values)), dtype=torch.float32)


def compute_advantage(adv_estimator: str, **inputs: Any) -> tuple[Tensor, Tensor]:
    """Run the estimator named by ``algorithm.adv_estimator`` on whichever of ``inputs`` it takes.

    The inputs are veRL's names: ``token_level_rewards``, ``response_mask``, ``values`` (gae),
    ``index`` (the group ids: grpo, rloo, reinforce_plus_plus_baseline, opo, grpo_passk, gpg),
    ``reward_baselines`` (remax), ``gamma``, ``lam``,
    ``norm_adv_by_std_in_grpo``, ``epsilon``. Inputs an estimator does not take are left
    out, so a trainer can pass the whole set; one it needs but lacks is an error that names it.
    Plays the part of veRL ``ray_trainer.compute_advantage`` without the ``DataProto``.
    """
    fn = get_adv_estimator_fn(adv_estimator)
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in inputs.items() if k in params and v is not None}
    missing = [name for name, p in params.items() if p.default is inspect.Parameter.empty and name not in kwargs]
    if missing:
        raise ValueError(
            f"adv_estimator {adv_estimator!r} needs {', '.join(missing)}; "
            f"got {', '.join(sorted(k for k, v in inputs.items() if v is not None)) or 'nothing'}"
        )
    return fn(**kwargs)
