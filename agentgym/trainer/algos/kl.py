"""KL to the reference policy: controllers (``algorithm.kl_ctrl``), estimators (``kl_loss_type`` /
``kl_penalty``), the KL loss and KL in the reward (veRL ``core_algos``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    pass

from agentgym.trainer.algos.aggregation import agg_loss
from agentgym.trainer.algos.stats import masked_mean, unknown_name

Tensor = torch.Tensor


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
    raise unknown_name("algorithm.kl_ctrl.type", type, ["fixed", "adaptive"])


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
    raise unknown_name("kl_penalty", kl_penalty, KL_PENALTY_TYPES)


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
