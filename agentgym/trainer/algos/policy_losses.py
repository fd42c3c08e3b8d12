"""Policy losses, keyed by ``actor.policy_loss.loss_mode`` (veRL ``core_algos``'s
``POLICY_LOSS_REGISTRY``), the entropy and value losses, and the actor's whole loss."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from agentgym.trainer.algos.aggregation import agg_loss
from agentgym.trainer.algos.kl import compute_kl_loss
from agentgym.trainer.algos.stats import entropy_from_logits, masked_mean, masked_sum, unknown_name

Tensor = torch.Tensor


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
        raise unknown_name("policy_loss.loss_mode", name, list(POLICY_LOSS_REGISTRY))
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
    dual_clip: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate with dual clip. Mirrors veRL ``core_algos.compute_policy_loss_vanilla``.

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``pg_losses1 = -A * ratio``; ``pg_losses2 = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)``
    (each bound defaults to ``clip_ratio``); ``clip_pg_losses1 = max(pg_losses1, pg_losses2)``.
    Dual clip (Ye et al. 2019) caps the loss of negative-advantage tokens at
    ``pg_losses3 = -A * clip_ratio_c``: for ``A < 0`` the loss is ``min(pg_losses3, clip_pg_losses1)``.
    ``rollout_is_weights`` (optional, per token) multiplies the loss matrix before aggregation.
    ``dual_clip=False`` (ROLL's ``dual_clip_loss`` off) leaves out the dual clip (veRL always applies it).

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

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1) if dual_clip else clip_pg_losses1
    if not dual_clip:
        pg_clipfrac_lower = torch.zeros_like(pg_clipfrac_lower)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@_register_policy_loss("topr")
def compute_policy_loss_topr(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    episode_scores: Tensor | None = None,
    topr_positive_weight: float = 1.0,
    topr_negative_weight: float = 1.0,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """TOPR, Tapered Off-Policy REINFORCE (Le Roux et al. 2025, eq. 8), as ROLL's ``pg_variant: topr``.

    Trajectories with a positive score (``episode_scores > 0``) get the plain REINFORCE/SFT term
    ``-A * log_prob``; the others ``-sg[clip(ratio, 0, 1)] * A * log_prob`` (truncated importance
    weight), each weighted by ``topr_positive_weight`` / ``topr_negative_weight``, then ``agg_loss``.
    No PPO clipping: ``pg_clipfrac`` reports the share of negative trajectories' tokens whose ratio
    exceeded 1 (truncated). ``pg_clipfrac_lower`` is 0.
    """
    if episode_scores is None:
        raise ValueError("topr needs episode_scores: each trajectory's score (its token rewards summed)")
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    positive = (episode_scores > 0).to(log_prob.dtype).unsqueeze(-1).expand_as(log_prob)
    negative = 1.0 - positive
    truncated = torch.clamp(ratio, 0.0, 1.0).detach()
    pg_losses = (
        topr_positive_weight * -advantages * log_prob * positive
        + topr_negative_weight * -truncated * advantages * log_prob * negative
    )
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    pg_clipfrac = masked_mean(((ratio > 1.0) & (negative > 0)).to(log_prob.dtype), response_mask)
    ppo_kl = masked_mean(old_log_prob - log_prob, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, torch.zeros_like(pg_clipfrac)


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
    **_: Any,
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


@_register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GPG's loss: the plain policy gradient ``-A * log_prob``, no importance ratio and no clip.

    Mirrors veRL ``core_algos.compute_policy_loss_gpg`` (paired with ``adv_estimator=gpg``). Returns
    ``pg_loss`` and, for the same metrics as the other modes, ``pg_clipfrac`` 0, ``ppo_kl`` (token-level,
    from ``old_log_prob``) and ``pg_clipfrac_lower`` 0.
    """
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    ppo_kl = masked_mean((old_log_prob - log_prob).detach(), response_mask)
    return pg_loss, zero, ppo_kl, zero


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
    dual_clip: bool = True,
    episode_scores: Tensor | None = None,
    sft_loss_coef: float = 0.0,
    topr_positive_weight: float = 1.0,
    topr_negative_weight: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """The actor's loss as veRL's ``dp_actor.update_policy`` assembles it, with every term logged.

    ``loss = pg_loss - entropy_coeff * entropy_loss + kl_loss_coef * kl_loss``, where ``pg_loss``
    comes from ``POLICY_LOSS_REGISTRY[loss_mode]``, ``entropy_loss = agg_loss(entropy)`` from the
    per-token ``entropy`` (``entropy_from_logits``; needed when ``entropy_coeff != 0``) and
    ``kl_loss = compute_kl_loss(...)`` when ``use_kl_loss`` (needs ``ref_log_prob``). The keyword
    names are veRL's ``actor_rollout_ref.actor`` keys. Beside veRL's terms: ``sft_loss_coef`` (ROLL)
    adds ``sft_loss_coef * agg_loss(-log_prob)`` over the trajectories whose ``episode_scores`` are
    positive (an SFT loss on the successes, ``actor/sft_loss``); ``dual_clip`` and the ``topr_*``
    weights go to the policy loss.

    Returns ``(loss, metrics)``; metrics use veRL's names: ``actor/pg_loss``,
    ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, and when present
    ``actor/entropy``, ``actor/kl_loss``, ``actor/kl_coef``.
    """
    extra: dict[str, Any] = {"dual_clip": dual_clip} if loss_mode == "vanilla" else {}
    if loss_mode == "topr":
        extra = {
            "episode_scores": episode_scores,
            "topr_positive_weight": topr_positive_weight,
            "topr_negative_weight": topr_negative_weight,
        }
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
        **extra,
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
        kl_loss = compute_kl_loss(log_prob, ref_log_prob, response_mask, kl_loss_type, loss_agg_mode, global_batch_info)
        loss = loss + kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach().item()
        metrics["actor/kl_coef"] = kl_loss_coef
    if sft_loss_coef:
        if episode_scores is None:
            raise ValueError("sft_loss_coef needs episode_scores (each trajectory's score)")
        positive = (episode_scores > 0).to(response_mask.dtype).unsqueeze(-1) * response_mask
        sft_loss = agg_loss(-log_prob, positive, loss_agg_mode, **(global_batch_info or {}))
        loss = loss + sft_loss_coef * sft_loss
        metrics["actor/sft_loss"] = sft_loss.detach().item()
    return loss, metrics
