"""Off-policy correction between the policy that sampled the tokens and the trainer's policy.

Three policies meet in an update: ``pi_behav``, the weights the policy server sampled with (its
logprobs, ``rollout_log_probs``; in asynchronous training up to ``L`` versions old); ``pi_old``
(the *proximal* policy of decoupled PPO), the trainer's weights before the update; ``pi_theta``, the
weights being updated. ``actor_rollout_ref.actor.use_rollout_log_probs`` (in asynchronous training
``async_training.use_rollout_log_probs``) says the servers' logprobs are the behaviour policy's.
``algorithm.rollout_correction`` (veRL's names) then picks:

* ``rollout_is: null`` (bypass): ``pi_old := pi_behav``; PPO clips ``pi_theta / pi_behav``. No
  extra forward pass.
* ``rollout_is: token | sequence`` (decoupled PPO, Hilton et al. 2021): ``pi_old`` is recomputed by
  the trainer, PPO clips ``pi_theta / pi_old``, and each token's loss is multiplied by the truncated
  importance weight of the behaviour policy: ``token``: ``w_t = min(pi_old(y_t) / pi_behav(y_t), C)``;
  ``sequence``: ``w = min(prod_t pi_old(y_t) / pi_behav(y_t), C)`` on every token of the sequence
  (products taken over the sampled tokens only), ``C = rollout_is_threshold``. Ratios are computed in
  log space and bounded to ``[exp(-20), exp(20)]`` before truncation, as veRL does;
  ``rollout_is_batch_normalize`` rescales the weights to mean 1 over the batch afterwards.

Logged (veRL's names, ``rollout_corr/``): ``rollout_is_mean`` (of the weights applied),
``rollout_is_max`` / ``rollout_is_min`` (of the ratios before truncation),
``rollout_is_ratio_fraction_high`` (the share truncated: tokens, or sequences at ``sequence``
level) and ``kl`` (``mean(log pi_behav - log pi_old)`` over sampled tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

LEVELS = ("token", "sequence")
SAFETY = 20.0


@dataclass(frozen=True)
class RolloutCorrection:
    """``algorithm.rollout_correction``."""

    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False

    @classmethod
    def from_cfg(cls, cfg: Any) -> RolloutCorrection:
        section = cfg.algorithm.rollout_correction
        return cls(section.rollout_is, section.rollout_is_threshold, section.rollout_is_batch_normalize)

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None


def rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float = 2.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights ``pi_old / pi_behav`` per token (0 where the mask is 0) and metrics."""
    if level not in LEVELS:
        raise ValueError(f"algorithm.rollout_correction.rollout_is must be one of {LEVELS} or null, got {level!r}")
    if threshold <= 0:
        raise ValueError(f"algorithm.rollout_correction.rollout_is_threshold must be > 0, got {threshold}")
    mask = response_mask.to(old_log_prob.dtype)
    log_ratio = (old_log_prob - rollout_log_prob) * mask
    if level == "token":
        ratio = torch.exp(log_ratio.clamp(-SAFETY, SAFETY))
        picked = ratio[mask.bool()]
        high = (picked > threshold).float()
    else:
        seq_ratio = torch.exp(log_ratio.sum(-1).clamp(-SAFETY, SAFETY))
        rows = mask.sum(-1) > 0
        ratio = seq_ratio[:, None].expand_as(mask)
        picked = seq_ratio[rows]
        high = (picked > threshold).float()
    weights = ratio.clamp(max=threshold) * mask
    if batch_normalize and mask.sum() > 0:
        weights = weights / (weights.sum() / mask.sum()).clamp(min=1e-8)
    metrics: dict[str, float] = {}
    if picked.numel():
        applied = weights[mask.bool()]
        metrics = {
            "rollout_corr/rollout_is_mean": float(applied.mean()),
            "rollout_corr/rollout_is_max": float(picked.max()),
            "rollout_corr/rollout_is_min": float(picked.min()),
            "rollout_corr/rollout_is_ratio_fraction_high": float(high.mean()),
            "rollout_corr/kl": float(-(log_ratio.sum() / mask.sum())),
        }
    return weights.detach(), metrics
