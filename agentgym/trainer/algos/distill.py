"""On-policy distillation's advantage (Thinking Machines' "On-Policy Distillation", prime-rl's
``teacher_tau``, NeMo-RL, TRL, veRL's recipes): a teacher scores every token the student sampled, and
each sampled token's advantage gets the negative per-token reverse KL

    A_t = env_coef * A_env_t - kl_coef * (log pi_student(x_t) - log pi_teacher(x_t))

with no discounting: a token is credited only for its own agreement with the teacher. The reverse KL
is estimated on the sampled token (its single-sample estimate); it is added after the estimator, so a
group whose env rewards are all equal still learns from the teacher, and ``env_coef=0`` is pure
distillation.

The full-distribution form (``distillation.loss_mode=topk``, GKD / MiniLLM, veRL's ``use_topk``): the
teacher returns its ``k`` most likely tokens at each scored position, and the loss is the same reverse
KL ``KL(pi_student || pi_teacher)`` computed exactly over ``k + 1`` buckets, those tokens and a tail
bucket holding the rest of each distribution's mass (``topk_reverse_kl``), from the student's logits
with gradient. Grouping tokens into buckets can only lower a KL, so it is a lower bound of the full one,
0 exactly when the two agree on the buckets. Reverse (student first) because it is the objective the
sampled estimator follows in expectation (the two modes differ in variance, not in what they aim at),
and because it is mode-seeking: a small student is pushed to put its mass on the teacher's likely
tokens rather than to cover the teacher's whole distribution. The tail bucket keeps it a proper KL
without renormalising: student mass outside the teacher's top-k is pushed down too.
``distillation.beta`` (TRL GKD's) picks another divergence over the same buckets: 0 the forward KL (the
teacher's distribution as soft labels on the student's own states), between 0 and 1 a generalized JSD
(``topk_generalized_jsd``).
"""

from __future__ import annotations

import math

import torch

from agentgym.trainer.algos.stats import masked_mean

Tensor = torch.Tensor


def reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Per-token reverse KL estimate on the sampled token: ``log pi_student - log pi_teacher``."""
    return student_log_probs - teacher_log_probs


def log1mexp(x: Tensor, floor: float) -> Tensor:
    """``log(1 - exp(x))`` for log-masses ``x <= 0``, at least ``log(floor)`` (a tail with no mass)."""
    return torch.log((-torch.expm1(x)).clamp(min=floor))


def with_tail(topk: Tensor, floor: float) -> Tensor:
    """``(..., k)`` log-probs of the teacher's top-k tokens, and a last bucket with the rest of the mass,
    ``log(1 - sum exp(topk))`` floored at ``floor`` (a model sure of its top-k keeps a KL finite)."""
    return torch.cat([topk, log1mexp(torch.logsumexp(topk, -1), floor).unsqueeze(-1)], -1)


def topk_reverse_kl(student_topk: Tensor, teacher_topk: Tensor, floor: float = 1e-6) -> Tensor:
    """Per-position ``KL(student || teacher)`` over the teacher's top-k tokens and a tail bucket.

    ``student_topk`` / ``teacher_topk``: ``(..., k)`` log-probs (full-vocabulary ``log_softmax``) of the
    teacher's top-k tokens under each model. Returns ``(...)``."""
    s = with_tail(student_topk, floor)
    t = with_tail(teacher_topk.to(s.dtype), floor)
    return (s.exp() * (s - t)).sum(-1)


def topk_generalized_jsd(student_topk: Tensor, teacher_topk: Tensor, beta: float, floor: float = 1e-6) -> Tensor:
    """Per-position generalized Jensen-Shannon divergence over the same ``k + 1`` buckets, with TRL GKD's
    ``beta``: ``beta * KL(teacher || M) + (1 - beta) * KL(student || M)``, ``M = beta * teacher + (1 - beta) *
    student``. Divided by ``beta * (1 - beta)`` it tends to the reverse KL as ``beta -> 1`` (so ``beta=1`` is
    ``topk_reverse_kl``) and to the forward ``KL(teacher || student)`` as ``beta -> 0``; both ends are taken
    exactly, the inside unscaled, as TRL does. The forward end is a cross-entropy against the teacher's
    distribution on the student's own states: its gradient on a token is ``p_student - p_teacher``, however
    little mass the student puts there, where the reverse KL's is weighted by the student's own mass."""
    if beta >= 1.0:
        return topk_reverse_kl(student_topk, teacher_topk, floor)
    s = with_tail(student_topk, floor)
    t = with_tail(teacher_topk.to(s.dtype), floor)
    if beta <= 0.0:
        return (t.exp() * (t - s)).sum(-1)
    m = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), 0)
    return beta * (t.exp() * (t - m)).sum(-1) + (1 - beta) * (s.exp() * (s - m)).sum(-1)


def student_on_teacher_support(logits: Tensor, topk_ids: Tensor) -> tuple[Tensor, Tensor]:
    """From the student's logits ``(b, R, vocab)`` (float): its log-probs of the teacher's top-k tokens
    ``topk_ids`` ``(b, R, k)`` (with gradient) and its most likely token at each position ``(b, R)``."""
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    return logits.gather(-1, topk_ids) - log_z, logits.detach().argmax(-1)


def teacher_support(logits: torch.Tensor, micro: dict[str, Tensor], aux: dict[str, Tensor] | None, full: int) -> None:
    """On-policy distillation's top-k form: with ``aux`` and the teacher's ``teacher_topk_ids`` in
    ``micro``, put the student's log-probs of those tokens (``student_topk_log_probs``, ``(b, R, k)``,
    with gradient) and its most likely token (``student_greedy``, ``(b, R)``) in ``aux``, padded to ``full``."""
    if aux is None or "teacher_topk_ids" not in micro:
        return
    width = logits.shape[1]
    ids = micro["teacher_topk_ids"][:, :width]
    if ids.shape[1] < width:
        ids = torch.nn.functional.pad(ids, (0, 0, 0, width - ids.shape[1]))
    topk, greedy = student_on_teacher_support(logits, ids)
    if width < full:
        topk = torch.nn.functional.pad(topk, (0, 0, 0, full - width))
        greedy = torch.nn.functional.pad(greedy, (0, full - width), value=-1)
    aux["student_topk_log_probs"], aux["student_greedy"] = topk[:, :full], greedy[:, :full]


def topk_metrics(
    kl: Tensor, student_greedy: Tensor, teacher_greedy: Tensor, mask: Tensor, action: Tensor | None
) -> dict[str, float]:
    """``distill/topk_kl`` and ``distill/greedy_agreement`` (the student's most likely token is the
    teacher's) over the scored tokens of ``mask``; with ``action`` (a ``(b, R)`` 0/1 mask of the tokens
    of the reply's action) the same on the action's tokens (``_action``) and on the others (``_other``)."""
    out: dict[str, float] = {}
    agree = (student_greedy == teacher_greedy).to(kl.dtype)
    parts = {"": mask.to(kl.dtype)}
    if action is not None:
        parts["_action"] = parts[""] * action.to(kl.dtype)
        parts["_other"] = parts[""] * (1 - action.to(kl.dtype))
    for suffix, m in parts.items():
        if bool(m.any()):
            out[f"distill/topk_kl{suffix}"] = float(masked_mean(kl.detach(), m))
            out[f"distill/greedy_agreement{suffix}"] = float(masked_mean(agree, m))
    return out


def compute_distillation_advantage(
    advantages: Tensor,
    student_log_probs: Tensor,
    teacher_log_probs: Tensor,
    response_mask: Tensor,
    kl_coef: float = 1.0,
    env_coef: float = 1.0,
    clip: float | None = None,
    action: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """``env_coef * advantages - kl_coef * reverse_kl`` on the tokens of ``response_mask`` (the sampled
    tokens the teacher scored), ``env_coef * advantages`` elsewhere; and the ``distill/*`` metrics.
    ``clip``: each token's reverse KL is clipped to ``[-clip, clip]`` first (a token the teacher finds
    all but impossible otherwise pushes with a weight of tens of nats); the metrics are unclipped.
    ``action``: the reply's action tokens, for ``distill/reverse_kl_action`` / ``_other``. ``kl_coef=0``
    leaves the env advantage alone (the top-k form carries the teacher's signal in the loss instead)."""
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
        if action is not None:
            for suffix, m in (("_action", mask * action), ("_other", mask * (1 - action))):
                if bool(m.any()):
                    metrics[f"distill/reverse_kl{suffix}"] = float(masked_mean(rkl, m))
    return out, metrics
