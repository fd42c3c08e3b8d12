"""The PPO trainer's maths: pure functions over ``(batch, seq)`` tensors.

Everything here mirrors veRL's ``verl/trainer/ppo/core_algos.py`` and
``verl/utils/torch_functional.py`` under veRL's names and config keys, so numbers can be
checked against veRL one for one. Each docstring names the veRL function it mirrors;
the few places that deliberately differ say so under "Differs from veRL".

Layout. A batch row is one trajectory's *response region*: every token from the first
sampled token to the end, right-padded to a common length (veRL's ``responses``). In a
multi-turn episode the region holds the model's sampled tokens (``response_mask`` 1) and,
between them, the observation tokens that env and tool messages added (``response_mask``
0), then padding (0). Rewards live on sampled tokens; observation tokens and padding never
get gradient (every loss goes through ``agg_loss``, which multiplies by the mask).

Differs from veRL, deliberately:

- Plain keyword arguments (veRL's key names) instead of ``ActorConfig``/``AlgoConfig``/``DataProto``.
- ``reinforce_plus_plus`` carries the return across observation tokens (veRL PR #7300); its
  returns are 0 on mask-0 tokens, which no loss reads.
- ``agg_loss`` on a micro-batch with no masked-in token gives 0, where veRL gives 0/0 = NaN;
  masked-out entries are zeroed with ``torch.where`` in every mode, so a NaN there cannot leak.
- ``compute_policy_loss_gspo`` defaults its clip to GSPO's 3e-4 / 4e-4 (veRL reads the actor's
  ``clip_ratio_*``, default 0.2, and sets 3e-4 / 4e-4 in its GSPO recipe).
- A misspelt name (estimator, loss mode, KL type, aggregation mode) raises ``ValueError`` with
  a "Did you mean" hint; group ids (``index``) may also be a tensor.

Sections: masked statistics · KL controllers · advantage estimators (``ADV_ESTIMATOR_REGISTRY``,
keyed by ``algorithm.adv_estimator``) · loss aggregation (``agg_loss``) · policy losses
(``POLICY_LOSS_REGISTRY``, keyed by ``policy_loss.loss_mode``) · KL estimators, KL loss and
KL-in-reward · entropy and value losses · the actor loss · turn-level credit (rewards from
``Trajectory`` objects onto tokens).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from agentgym.types import Trajectory

Tensor = torch.Tensor

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_actor_loss",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_kl_loss",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "token_level_scores_from_rewards",
    "trajectories_to_token_rewards",
]


def _unknown(kind: str, name: str, known: Sequence[str]) -> ValueError:
    """A ValueError that lists the known names and suggests the closest one."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(known))}.")


# ---- masked statistics (verl/utils/torch_functional.py) --------------------------------


def masked_sum(values: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by the mask).

    Mirrors veRL ``torch_functional.masked_sum``: values outside the mask are replaced by 0
    before multiplying, so a NaN/inf there cannot leak into the sum or its gradient.
    """
    mask = mask.to(values.dtype)
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (kept * mask).sum() if axis is None else (kept * mask).sum(dim=axis)


def masked_mean(values: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """Mean of ``values`` over the masked elements (all of them, or along ``axis``).

    Mirrors veRL ``torch_functional.masked_mean``: ``masked_sum / (mask.sum() + 1e-8)``, so an
    empty mask gives 0 instead of NaN.
    """
    mask = mask.to(values.dtype)
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements; ``unbiased`` applies Bessel's correction n/(n-1).

    Mirrors veRL ``torch_functional.masked_var``, including its errors: with ``unbiased`` a
    mask selecting 0 or 1 elements raises (there is no sample variance of one number).
    """
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no elements; at least one must be 1.")
        if n == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance divides by "
                "zero. Train on a batch with more than one response token."
            )
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the mask.

    Mirrors veRL ``torch_functional.masked_whiten``. Every position is transformed (masked-out
    ones too), but only masked-in ones enter the statistics. ``shift_mean=False`` adds the
    mean back (scale only).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# ---- KL controllers ------------------------------------------------------------------


class AdaptiveKLController:
    """The in-reward KL coefficient, steered toward ``target_kl`` (Ziegler et al. 2019).

    Mirrors veRL ``core_algos.AdaptiveKLController``: after each batch,
    ``value *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs horizon > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


class FixedKLController:
    """A constant in-reward KL coefficient. Mirrors veRL ``core_algos.FixedKLController``."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to update: the coefficient is fixed."""


def get_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: float = 10000
) -> AdaptiveKLController | FixedKLController:
    """Build the controller named by ``algorithm.kl_ctrl.type`` (``fixed`` | ``adaptive``).

    Mirrors veRL ``core_algos.get_kl_controller``; the keyword names and defaults are veRL's
    ``algorithm.kl_ctrl`` keys (``type``, ``kl_coef``, ``target_kl``, ``horizon``).
    """
    if type == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    raise _unknown("algorithm.kl_ctrl.type", type, ["fixed", "adaptive"])


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
        raise _unknown("algorithm.adv_estimator", name, list(ADV_ESTIMATOR_REGISTRY))
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


# ---- loss aggregation ----------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | Tensor | None = None,
    global_batch_size: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """Reduce a ``(batch, seq)`` loss matrix to a scalar; ``loss_agg_mode`` is veRL's key.

    Mirrors veRL ``core_algos.agg_loss`` (the current, global-batch-aware version). With
    ``m`` the mask, ``S_i = sum_t m_it * loss_it`` the masked token-sum of row i, and ``B`` the
    number of rows with at least one masked-in token:

    - ``token-mean``: ``sum_i S_i / batch_num_tokens * dp_size`` (default: the local token count).
    - ``seq-mean-token-sum``: ``sum_i S_i / global_batch_size * dp_size`` (default ``B``).
    - ``seq-mean-token-mean``: ``sum_i (S_i / (n_i + 1e-8)) / global_batch_size * dp_size``.
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): ``seq-mean-token-sum / loss_scale_factor``; the
      factor defaults to the mask's last dimension (the padded response length). Set it to a
      constant (e.g. the max response length) to keep the scale the same across batches.
      (Older veRL releases divided the *batch* sum, not the sequence mean, by the length.)

    Rows with no masked-in token count in no denominator. ``dp_size``, ``batch_num_tokens``
    and ``global_batch_size`` let data-parallel ranks normalise by the global batch; with
    ``dp_size > 1`` the global counts are required.

    Differs from veRL: a micro-batch with no masked-in token at all gives 0, not 0/0 = NaN.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise _unknown("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = loss_mask.to(loss_mat.dtype)
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: token-mean with dp_size > 1 needs the global batch_num_tokens")
            batch_num_tokens = mask.sum().clamp(min=1)
        return masked.sum() / batch_num_tokens * dp_size
    tokens_per_row = mask.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        row_losses = masked.sum(dim=-1) / (tokens_per_row + 1e-8)
    else:
        row_losses = masked.sum(dim=-1)
    nonempty = (tokens_per_row > 0).to(loss_mat.dtype)
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(f"agg_loss: {loss_agg_mode} with dp_size > 1 needs the global_batch_size")
        global_batch_size = nonempty.sum().clamp(min=1)
    loss = (row_losses * nonempty).sum() / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


# ---- policy losses -------------------------------------------------------------------

POLICY_LOSS_REGISTRY: dict[str, Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]] = {}
"""``policy_loss.loss_mode`` -> loss; each returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``."""


def _register_policy_loss(name: str):
    def decorator(fn):
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The policy loss registered as ``name``. Mirrors veRL ``core_algos.get_policy_loss_fn``."""
    if name not in POLICY_LOSS_REGISTRY:
        raise _unknown("policy_loss.loss_mode", name, list(POLICY_LOSS_REGISTRY))
    return POLICY_LOSS_REGISTRY[name]


@_register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate with dual clip. Mirrors veRL ``core_algos.compute_policy_loss_vanilla``.

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``pg_losses1 = -A * ratio``; ``pg_losses2 = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)``
    (each bound defaults to ``clip_ratio``); ``clip_pg_losses1 = max(pg_losses1, pg_losses2)``.
    Dual clip (Ye et al. 2019) caps the loss of negative-advantage tokens at
    ``pg_losses3 = -A * clip_ratio_c``: for ``A < 0`` the loss is ``min(pg_losses3, clip_pg_losses1)``.
    ``rollout_is_weights`` (optional, per token) multiplies the loss matrix before aggregation.

    Returns ``pg_loss`` (``agg_loss`` of the matrix), ``pg_clipfrac`` (share of tokens where
    the clipped term won), ``ppo_kl`` (masked mean of ``old_log_prob - log_prob``, clamped) and
    ``pg_clipfrac_lower`` (share of tokens where the dual clip bound).
    ``global_batch_info`` holds ``agg_loss``'s keyword arguments (``dp_size``, ...).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (the dual-clip bound) must be greater than 1.0, got {clip_ratio_c}")
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(log_prob.dtype), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    dual_clipped = torch.gt(clip_pg_losses1, pg_losses3) & (advantages < 0)
    pg_clipfrac_lower = masked_mean(dual_clipped.to(log_prob.dtype), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@_register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = 3e-4,
    clip_ratio_high: float | None = 4e-4,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GSPO (Zheng et al. 2025): PPO clipping on a sequence-level importance ratio.

    Mirrors veRL ``core_algos.compute_policy_loss_gspo``. The sequence ratio is the geometric
    mean of the token ratios over the sampled tokens,
    ``s_i = exp(sum_t m_t (log_prob - old_log_prob) / |y_i|)``. Each token uses
    ``s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` (computed in log space as
    ``log_prob - log_prob.detach() + sg[log s_i]``, clamped at 10 before ``exp``): its value is
    ``s_i`` and its gradient flows through the token's own ``log_prob``. Then
    ``max(-A * s_it, -A * clip(s_it, 1 - clip_ratio_low, 1 + clip_ratio_high))``, aggregated
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (as veRL: GSPO is a sequence-level
    objective; the argument exists so every loss mode takes the same arguments, as does the
    unused ``clip_ratio_c``).

    Clip defaults are GSPO's own, from the paper and veRL's GSPO recipe: 3e-4 below, 4e-4
    above. A bound passed as None falls back to ``clip_ratio``, as veRL does.

    Returns ``pg_loss``, ``pg_clipfrac``, ``ppo_kl`` (token-level, unclamped) and
    ``pg_clipfrac_lower`` (always 0: GSPO has no dual clip).
    """
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if low is None or high is None:
        raise ValueError("gspo needs clip_ratio_low and clip_ratio_high (or clip_ratio for both)")

    mask = response_mask.to(log_prob.dtype)
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = mask.sum(dim=-1).clamp(min=1)
    negative_approx_kl_seq = masked_sum(negative_approx_kl, mask, axis=-1) / seq_lengths

    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    seq_importance_ratio = torch.exp(torch.clamp(log_seq_importance_ratio, max=10.0))

    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", **(global_batch_info or {}))

    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(log_prob.dtype), response_mask)
    pg_clipfrac_lower = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


# ---- KL estimators, KL loss, KL in the reward ----------------------------------------

KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
"""Names ``kl_penalty`` takes (``algorithm.kl_penalty``, ``actor.kl_loss_type``); each but
``full`` also takes a ``+`` suffix (e.g. ``k3+``): see ``kl_penalty``."""


def kl_penalty_forward(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs (Schulman's k1/k2/k3).

    Mirrors veRL ``core_algos.kl_penalty_forward``:

    - ``kl`` / ``k1``: ``logprob - ref_logprob``
    - ``abs``: ``|logprob - ref_logprob|``
    - ``mse`` / ``k2``: ``0.5 * (logprob - ref_logprob)^2``
    - ``low_var_kl`` / ``k3``: with ``d = clamp(ref_logprob - logprob, -20, 20)``,
      ``clamp(exp(d) - d - 1, -10, 10)``
    - ``full``: the exact KL needs the whole vocabulary's log-probs, which a sampled-token
      tensor does not hold; raises ``NotImplementedError``.
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError(
            "kl_penalty='full' needs the log-probs of every vocabulary token, not just the sampled "
            "one, and is not implemented (nor is it in veRL). Use 'low_var_kl' (k3), 'kl' (k1) or 'mse' (k2)."
        )
    raise _unknown("kl_penalty", kl_penalty, KL_PENALTY_TYPES)


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str = "kl") -> Tensor:
    """Per-token KL estimate, shaped like ``logprob``. Mirrors veRL ``core_algos.kl_penalty``.

    Plain names are ``kl_penalty_forward``. A ``+`` suffix (``k1+``, ``k3+``, ``low_var_kl+``,
    ...) keeps that estimator's value but takes its gradient from k2, whose gradient is an
    unbiased estimate of the KL's gradient (veRL's straight-through trick):
    ``k2 - sg[k2] + sg[forward]``.
    """
    straight_through = kl_penalty.endswith("+")
    base = kl_penalty[:-1] if straight_through else kl_penalty
    forward_score = kl_penalty_forward(logprob, ref_logprob, base)
    if not straight_through or base in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


_kl_penalty = kl_penalty  # for ``apply_kl_penalty``, whose veRL-named argument shadows the function


def compute_kl_loss(
    log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> Tensor:
    """The KL-to-reference loss term (``actor.use_kl_loss``), before ``kl_loss_coef``.

    As veRL's actor does it (``dp_actor.update_policy``): ``agg_loss(kl_penalty(log_prob,
    ref_log_prob, kl_loss_type), response_mask, loss_agg_mode)``. veRL's default type is
    ``low_var_kl``.
    """
    kld = kl_penalty(log_prob, ref_log_prob, kl_penalty=kl_loss_type)
    return agg_loss(kld, response_mask, loss_agg_mode, **(global_batch_info or {}))


def apply_kl_penalty(
    token_level_scores: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_ctrl: AdaptiveKLController | FixedKLController,
    kl_penalty: str = "kl",
) -> tuple[Tensor, dict[str, float]]:
    """KL in the reward (``algorithm.use_kl_in_reward``): ``rewards = scores - beta * kl * mask``.

    Mirrors veRL ``ray_trainer.apply_kl_penalty`` without the ``DataProto``: ``beta`` is
    ``kl_ctrl.value``; the batch KL is the mean over rows of each row's masked-mean KL; the
    controller is then updated with it and ``n_steps`` = the batch size.

    Returns ``(token_level_rewards, metrics)`` with veRL's metric names
    ``actor/reward_kl_penalty`` (the batch KL) and ``actor/reward_kl_penalty_coeff`` (the
    ``beta`` used, before the update).
    """
    kld = _kl_penalty(old_log_prob, ref_log_prob, kl_penalty=kl_penalty)
    kld = kld * response_mask.to(kld.dtype)
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, axis=-1).mean(dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics


# ---- entropy and value losses --------------------------------------------------------


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dimension: ``logsumexp(z) - sum softmax(z) * z``.

    Mirrors veRL ``torch_functional.entropy_from_logits``; ``(batch, seq, vocab) -> (batch, seq)``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def compute_entropy_loss(
    logits: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> Tensor:
    """Mean token entropy, aggregated like the policy loss. Mirrors veRL
    ``core_algos.compute_entropy_loss``; the actor *subtracts* ``entropy_coeff`` times it."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode, **(global_batch_info or {}))


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss. Mirrors veRL ``core_algos.compute_value_loss``.

    ``vpredclipped = clip(vpreds, values - cliprange_value, values + cliprange_value)``;
    ``vf_loss = 0.5 * agg_loss(max((vpreds - returns)^2, (vpredclipped - returns)^2))``.
    Returns ``(vf_loss, vf_clipfrac)``, the latter the share of tokens where the clipped
    error was the larger.
    """
    vpredclipped = torch.maximum(torch.minimum(vpreds, values + cliprange_value), values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.maximum(vf_losses1, vf_losses2)
    vf_loss = 0.5 * agg_loss(clipped_vf_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac


# ---- the actor loss ------------------------------------------------------------------


def compute_actor_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_mode: str = "vanilla",
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    entropy: Tensor | None = None,
    entropy_coeff: float = 0.0,
    use_kl_loss: bool = False,
    ref_log_prob: Tensor | None = None,
    kl_loss_coef: float = 0.001,
    kl_loss_type: str = "low_var_kl",
    rollout_is_weights: Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The actor's loss as veRL's ``dp_actor.update_policy`` assembles it, with every term logged.

    ``loss = pg_loss - entropy_coeff * entropy_loss + kl_loss_coef * kl_loss``, where ``pg_loss``
    comes from ``POLICY_LOSS_REGISTRY[loss_mode]``, ``entropy_loss = agg_loss(entropy)`` from the
    per-token ``entropy`` (``entropy_from_logits``; needed when ``entropy_coeff != 0``) and
    ``kl_loss = compute_kl_loss(...)`` when ``use_kl_loss`` (needs ``ref_log_prob``). The keyword
    names are veRL's ``actor_rollout_ref.actor`` keys.

    Returns ``(loss, metrics)``; metrics use veRL's names: ``actor/pg_loss``,
    ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, and when present
    ``actor/entropy``, ``actor/kl_loss``, ``actor/kl_coef``.
    """
    pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = get_policy_loss_fn(loss_mode)(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        rollout_is_weights=rollout_is_weights,
        global_batch_info=global_batch_info,
    )
    loss = pg_loss
    metrics = {
        "actor/pg_loss": pg_loss.detach().item(),
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    if entropy is not None:
        entropy_loss = agg_loss(entropy, response_mask, loss_agg_mode, **(global_batch_info or {}))
        metrics["actor/entropy"] = entropy_loss.detach().item()
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * entropy_loss
    elif entropy_coeff != 0:
        raise ValueError("entropy_coeff is non-zero but no per-token entropy was given")
    if use_kl_loss:
        if ref_log_prob is None:
            raise ValueError("use_kl_loss needs ref_log_prob (the reference policy's log-probs)")
        kl_loss = compute_kl_loss(
            log_prob, ref_log_prob, response_mask, kl_loss_type, loss_agg_mode, global_batch_info
        )
        loss = loss + kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach().item()
        metrics["actor/kl_coef"] = kl_loss_coef
    return loss, metrics


# ---- turn-level credit: rewards onto tokens ------------------------------------------


def token_level_scores_from_rewards(
    token_rewards: Sequence[Sequence[float]], response_mask: Tensor
) -> Tensor:
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
        raise ValueError(
            f"a trajectory's response region has {longest} tokens, more than response_length={width}"
        )
    response_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    response_mask = response_mask.reshape(len(masks), width)
    return token_level_scores_from_rewards(rewards, response_mask), response_mask
