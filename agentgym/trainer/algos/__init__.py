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
- ``agg_loss`` on a micro-batch with no masked-in token gives 0, where veRL gives 0/0 = NaN;
  masked-out entries are zeroed with ``torch.where`` in every mode, so a NaN there cannot leak.
- ``compute_policy_loss_gspo`` defaults its clip to GSPO's 3e-4 / 4e-4 (veRL reads the actor's
  ``clip_ratio_*``, default 0.2, and sets 3e-4 / 4e-4 in its GSPO recipe).
- A misspelt name (estimator, loss mode, KL type, aggregation mode) raises ``ValueError`` with
  a "Did you mean" hint; group ids (``index``) may also be a tensor.

Files: ``stats.py`` (masked statistics; log-probs and entropy from logits) · ``advantages.py``
(``ADV_ESTIMATOR_REGISTRY``, keyed by ``algorithm.adv_estimator``) · ``aggregation.py`` (``agg_loss``,
``LOSS_AGG_MODES``) · ``shaping.py`` (ROLL's reward normalisation and advantage clipping) ·
``rollout_correction.py`` (decoupled PPO's importance weights between the sampling and the trainer's policy) ·
``policy_losses.py`` (``POLICY_LOSS_REGISTRY``, keyed by ``policy_loss.loss_mode``; entropy and
value losses; the actor loss) · ``kl.py`` (KL controllers, estimators, KL loss, KL in the reward) ·
``token_rewards.py`` (rewards from ``Trajectory`` objects onto tokens) · ``turn_credit.py`` (GiGPO:
turn-level advantages for multi-turn episodes).
Everything is re-exported here: ``from agentgym.trainer import algos; algos.compute_advantage(...)``.
"""

from __future__ import annotations

from agentgym.trainer.algos.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_reinforce_return,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    discounted_returns,
    get_adv_estimator_fn,
    group_rows,
    reward_baselines_of,
    scores_equal,
)
from agentgym.trainer.algos.aggregation import (
    LOSS_AGG_MODES,
    agg_loss,
)
from agentgym.trainer.algos.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from agentgym.trainer.algos.policy_losses import (
    POLICY_LOSS_REGISTRY,
    compute_actor_loss,
    compute_entropy_loss,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_value_loss,
    get_policy_loss_fn,
)
from agentgym.trainer.algos.rollout_correction import (
    RolloutCorrection,
    rollout_is_weights,
)
from agentgym.trainer.algos.shaping import (
    RunningMoments,
    postprocess_advantages,
    shape_rewards,
)
from agentgym.trainer.algos.stats import (
    entropy_from_logits,
    log_probs_from_logits,
    masked_mean,
    masked_stats,
    masked_sum,
    masked_var,
    masked_whiten,
)
from agentgym.trainer.algos.token_rewards import (
    token_level_scores_from_rewards,
    trajectories_to_token_rewards,
)
from agentgym.trainer.algos.turn_credit import (
    GIGPO_MODES,
    STEP_GROUPINGS,
    compute_gigpo_advantage,
    normalise_in_groups,
    turn_returns,
)

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "GIGPO_MODES",
    "STEP_GROUPINGS",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "RunningMoments",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_actor_loss",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gigpo_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_reinforce_return",
    "compute_kl_loss",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "discounted_returns",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "group_rows",
    "kl_penalty",
    "kl_penalty_forward",
    "log_probs_from_logits",
    "masked_mean",
    "masked_stats",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "normalise_in_groups",
    "postprocess_advantages",
    "reward_baselines_of",
    "scores_equal",
    "shape_rewards",
    "RolloutCorrection",
    "rollout_is_weights",
    "token_level_scores_from_rewards",
    "trajectories_to_token_rewards",
    "turn_returns",
]
