"""On-policy distillation's advantage (Thinking Machines' "On-Policy Distillation", prime-rl's
``teacher_tau``, NeMo-RL, TRL, veRL's recipes): a teacher scores every token the student sampled, and
each sampled token's advantage gets the negative per-token reverse KL

    A_t = env_coef * A_env_t - kl_coef * (log pi_student(x_t) - log pi_teacher(x_t))

with no discounting: a token is credited only for its own agreement with the teacher. The reverse KL
is estimated on the sampled token (its single-sample estimate); it is added after the estimator, so a
group whose env rewards are all equal still learns from the teacher, and ``env_coef=0`` is pure
distillation.
"""

from __future__ import annotations

import torch

from agentgym.trainer.algos.stats import masked_mean

Tensor = torch.Tensor


def reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Per-token reverse KL estimate on the sampled token: ``log pi_student - log pi_teacher``."""
    return student_log_probs - teacher_log_probs


def compute_distillation_advantage(
    advantages: Tensor,
    student_log_probs: Tensor,
    teacher_log_probs: Tensor,
    response_mask: Tensor,
    kl_coef: float = 1.0,
    env_coef: float = 1.0,
    clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """``env_coef * advantages - kl_coef * reverse_kl`` on the tokens of ``response_mask`` (the sampled
    tokens the teacher scored), ``env_coef * advantages`` elsewhere; and the ``distill/*`` metrics.
    ``clip``: each token's reverse KL is clipped to ``[-clip, clip]`` first (a token the teacher finds
    all but impossible otherwise pushes with a weight of tens of nats); the metrics are unclipped."""
    mask = response_mask.to(advantages.dtype)
    rkl = reverse_kl(student_log_probs, teacher_log_probs) * mask
    pushed = rkl if clip is None else rkl.clamp(-float(clip), float(clip))
    out = env_coef * advantages - kl_coef * pushed
    metrics = {}
    if bool(mask.any()):
        metrics = {
            "distill/reverse_kl": float(masked_mean(rkl, mask)),
            "distill/teacher_log_prob": float(masked_mean(teacher_log_probs, mask)),
            "distill/student_log_prob": float(masked_mean(student_log_probs, mask)),
            "distill/scored_tokens": float(mask.sum()),
        }
    return out, metrics
