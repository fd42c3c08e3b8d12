"""agentgym.trainer.algos against hand-worked numbers.

Every expected value below is worked out by hand (the arithmetic is in the comments) or by a
plain-Python reference loop written here, independently of the code under test. The running
example for multi-turn is a row with mask [1, 1, 0, 0, 1, 1, 0]: two sampled turns with an
observation between them and one padding token.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from agentgym.trainer import algos
from agentgym.types import Trajectory, Turn

F64 = torch.float64
GAP_MASK = [1, 1, 0, 0, 1, 1, 0]


def t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


def close(actual, expected, atol=1e-7):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), f"\n{actual}\n!=\n{expected}"


def whiten_ref(rows, mask):
    """Plain-Python masked whitening: mean and sample (n-1) variance over mask-1 entries."""
    picked = [v for row, m in zip(rows, mask, strict=True) for v, k in zip(row, m, strict=True) if k]
    mean, var = statistics.mean(picked), statistics.variance(picked)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in rows]


# ---- masked statistics ---------------------------------------------------------------


def test_masked_mean_var_whiten_by_hand():
    values = t([[1.0, 2.0, 3.0, 100.0]])
    mask = t([[1, 1, 1, 0]])
    close(algos.masked_mean(values, mask), 2.0)  # (1+2+3)/3
    close(algos.masked_var(values, mask, unbiased=False), 2.0 / 3.0)  # (1+0+1)/3
    close(algos.masked_var(values, mask), 1.0)  # (1+0+1)/(3-1): Bessel n/(n-1)
    # (v - mean) / sqrt(var + 1e-8); the masked-out 100 is transformed but not counted.
    # Exactly, veRL's masked mean divides by (count + 1e-8), which shows at 1e-8 in float64:
    mean = 6 / (3 + 1e-8)
    var = ((1 - mean) ** 2 + (2 - mean) ** 2 + (3 - mean) ** 2) / (3 + 1e-8) * 3 / 2
    s = math.sqrt(var + 1e-8)
    expected = [[(v - mean) / s for v in (1.0, 2.0, 3.0, 100.0)]]
    close(algos.masked_whiten(values, mask), expected, atol=1e-12)
    close(algos.masked_whiten(values, mask, shift_mean=False), [[e + mean for e in expected[0]]], atol=1e-12)
    close(algos.masked_whiten(values, mask), [[-1.0, 0.0, 1.0, 98.0]], atol=1e-6)  # to the eye


def test_masked_mean_along_axis_and_empty_rows():
    values = t([[1.0, 3.0, 7.0], [4.0, 4.0, 4.0]])
    mask = t([[1, 1, 0], [0, 0, 0]])
    close(algos.masked_mean(values, mask, axis=-1), [2.0, 0.0])  # empty row: 0/(0+1e-8) = 0


def test_masked_sum_ignores_nan_outside_mask():
    values = t([[1.0, float("nan"), 2.0]])
    close(algos.masked_sum(values, t([[1, 0, 1]])), 3.0)


def test_masked_var_needs_two_elements():
    with pytest.raises(ValueError, match="no elements"):
        algos.masked_var(t([[1.0, 2.0]]), t([[0, 0]]))
    with pytest.raises(ValueError, match="single element"):
        algos.masked_var(t([[1.0, 2.0]]), t([[1, 0]]))


# ---- GAE -----------------------------------------------------------------------------


def gae_reference(rewards, values, mask, gamma, lam):
    """GAE on the sampled tokens only, as if the mask-0 tokens were cut out; a mask-0 position
    then reports the advantage of the next sampled token (0 after the last)."""
    raw = []
    for r_row, v_row, m_row in zip(rewards, values, mask, strict=True):
        sampled = [i for i, m in enumerate(m_row) if m]
        adv = {}
        running, next_v = 0.0, 0.0
        for i in reversed(sampled):
            delta = r_row[i] + gamma * next_v - v_row[i]
            running = delta + gamma * lam * running
            adv[i] = running
            next_v = v_row[i]
        row = []
        for i in range(len(m_row)):
            later = [j for j in sampled if j >= i]
            row.append(adv[later[0]] if later else 0.0)
        raw.append(row)
    return raw


def test_gae_hand_worked_observation_gap():
    # mask [1, 0, 1], gamma = lam = 1. Reward 7 and value 9 on the observation are ignored.
    # t=2: delta = 1 + 0 - 0.25 = 0.75 -> A2 = 0.75
    # t=1: observation: carries A = 0.75 and next value 0.25
    # t=0: delta = 0 + 0.25 - 0.5 = -0.25 -> A0 = -0.25 + 0.75 = 0.5
    rewards, values, mask = t([[0.0, 7.0, 1.0]]), t([[0.5, 9.0, 0.25]]), t([[1, 0, 1]])
    adv, ret = algos.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    close(ret, [[1.0, 9.75, 1.0]])  # raw advantages [0.5, 0.75, 0.75] + values
    # whitening over {0.5, 0.75}: mean 0.625, sample var 0.03125, std 0.1767767
    s = math.sqrt(0.03125 + 1e-8)
    close(adv, [[-0.125 / s, 0.125 / s, 0.125 / s]])


def test_gae_matches_reference_with_gaps_and_padding():
    rewards = [[0.0, 0.3, 5.0, -2.0, 0.0, 1.0, 4.0], [0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]]
    values = [[0.1, 0.2, 3.0, 3.0, 0.4, 0.6, 9.0], [0.3, -0.1, 0.2, 0.7, 0.0, 0.0, 0.0]]
    mask = [GAP_MASK, [1, 1, 1, 0, 0, 0, 0]]
    gamma, lam = 0.9, 0.8
    adv, ret = algos.compute_gae_advantage_return(t(rewards), t(values), t(mask), gamma, lam)
    raw = gae_reference(rewards, values, mask, gamma, lam)
    close(ret, [[a + v for a, v in zip(ra, rv, strict=True)] for ra, rv in zip(raw, values, strict=True)])
    close(adv, whiten_ref(raw, mask))


def test_gae_hand_worked_single_turn_padding():
    # mask [1, 1, 0]: gamma = 0.5, lam = 1. Rewards [0, 1, 0], values [0.2, 0.4, 0].
    # t=1: delta = 1 + 0 - 0.4 = 0.6 -> A1 = 0.6 ; t=0: delta = 0 + 0.5*0.4 - 0.2 = 0 -> A0 = 0 + 0.5*0.6 = 0.3
    _, ret = algos.compute_gae_advantage_return(
        t([[0.0, 1.0, 0.0]]), t([[0.2, 0.4, 0.0]]), t([[1, 1, 0]]), gamma=0.5, lam=1.0
    )
    close(ret, [[0.5, 1.0, 0.0]])  # [0.3 + 0.2, 0.6 + 0.4, 0 + 0]


# ---- GRPO / Dr.GRPO / RLOO -----------------------------------------------------------


def _outcome_batch():
    # scores (row sums): group a [1, 0], group b [2, 4, 6], group c [3] (a group of one)
    rewards = t(
        [
            [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0],
            [1.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 6.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0],
        ]
    )
    mask = t([GAP_MASK, [1, 1, 1, 0, 0, 0, 0], GAP_MASK, GAP_MASK, [1] * 7, GAP_MASK])
    index = ["a", "a", "b", "b", "b", "c"]
    return rewards, mask, index


def test_grpo_hand_worked_with_group_of_one():
    rewards, mask, index = _outcome_batch()
    adv, ret = algos.compute_grpo_outcome_advantage(rewards, mask, index)
    eps = 1e-6
    std_a = math.sqrt(0.5)  # scores 1, 0: mean 0.5, sample var (0.25+0.25)/1
    std_b = 2.0  # scores 2, 4, 6: mean 4, sample var (4+0+4)/2
    per_row = [0.5 / (std_a + eps), -0.5 / (std_a + eps), -2 / (std_b + eps), 0.0, 2 / (std_b + eps)]
    per_row.append(3.0 / (1.0 + eps))  # group of one: mean 0, std 1
    expected = [[a * m for m in row] for a, row in zip(per_row, mask.tolist(), strict=True)]
    close(adv, expected)
    close(ret, expected)


def test_grpo_group_of_equal_scores_has_zero_advantage_despite_rounding():
    """Four rows that all score 10.1, with the reward split over different tokens: their float32
    sums differ in the last bit, and (score - mean) / (std + 1e-6) would turn that into advantages
    far from 0. Equal scores must give exactly 0."""
    splits = [[10.1, 0.0, 0.0], [10.0, 0.1, 0.0], [9.9, 0.2, 0.0], [7.1, 3.0, 0.0]]
    rewards = torch.tensor(splits, dtype=torch.float32)  # as the trainer holds them
    scores = rewards.sum(dim=-1)
    assert scores.max() != scores.min(), "the case needs float32 sums that differ by rounding"
    naive = (scores - scores.mean()) / (scores.std() + 1e-6)
    assert naive.abs().max() > 0.1, "without the check rounding noise becomes a large advantage"
    adv, _ = algos.compute_grpo_outcome_advantage(rewards, torch.ones(4, 3), ["g"] * 4)
    assert torch.equal(adv, torch.zeros(4, 3))
    # a real spread is untouched
    adv, _ = algos.compute_grpo_outcome_advantage(t([[10.1, 0.0], [10.2, 0.0]]), torch.ones(2, 2), ["g", "g"])
    assert adv[0, 0] < -0.5 and adv[1, 0] > 0.5


def test_dr_grpo_skips_std_division():
    rewards, mask, index = _outcome_batch()
    adv, _ = algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    per_row = [0.5, -0.5, -2.0, 0.0, 2.0, 3.0]
    close(adv, [[a * m for m in row] for a, row in zip(per_row, mask.tolist(), strict=True)])


def test_grpo_index_may_be_numpy_or_tensor():
    rewards, mask, index = _outcome_batch()
    expected, _ = algos.compute_grpo_outcome_advantage(rewards, mask, index)
    close(algos.compute_grpo_outcome_advantage(rewards, mask, np.array(index, dtype=object))[0], expected)
    ids = torch.tensor([0, 0, 1, 1, 1, 2])
    close(algos.compute_grpo_outcome_advantage(rewards, mask, ids)[0], expected)
    with pytest.raises(ValueError, match="group ids"):
        algos.compute_grpo_outcome_advantage(rewards, mask, index[:3])


def test_rloo_leave_one_out_by_hand():
    # group x scores [1, 0, 2]: each minus the mean of the other two -> [1-1, 0-1.5, 2-0.5]
    # group y [5]: a group of one keeps its raw score
    rewards = t([[1.0, 0.0], [0.0, 0.0], [0.5, 1.5], [5.0, 0.0]])
    mask = t([[1, 1], [1, 0], [1, 1], [1, 1]])
    adv, ret = algos.compute_rloo_outcome_advantage(rewards, mask, ["x", "x", "x", "y"])
    expected = [[0.0, 0.0], [-1.5, 0.0], [1.5, 1.5], [5.0, 5.0]]
    close(adv, expected)
    close(ret, expected)


# ---- REINFORCE++ ---------------------------------------------------------------------


def test_reinforce_plus_plus_carries_return_across_observations():
    # gamma = 0.5. Row 0 (mask [1,1,0,0,1,1,0]): turn reward 0.5 at t=1, outcome 1 at t=5,
    # and a stray 7 on observation t=3, which is ignored.
    #   t=5: 1 ; t=4: 0 + 0.5*1 = 0.5 ; t=3,2: observation, running return stays 0.5
    #   t=1: 0.5 + 0.5*0.5 = 0.75 ; t=0: 0.5*0.75 = 0.375 ; t=6: padding, 0
    # Row 1 (mask [1,1,1,0,...]): reward 2 at t=2 -> [0.5, 1, 2, 0, 0, 0, 0]
    rewards = t([[0.0, 0.5, 0.0, 7.0, 0.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]])
    mask = [GAP_MASK, [1, 1, 1, 0, 0, 0, 0]]
    adv, ret = algos.compute_reinforce_plus_plus_outcome_advantage(rewards, t(mask), gamma=0.5)
    returns = [[0.375, 0.75, 0.0, 0.0, 0.5, 1.0, 0.0], [0.5, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0]]
    close(ret, returns)
    whitened = whiten_ref(returns, mask)
    close(adv, [[w * m for w, m in zip(wr, mr, strict=True)] for wr, mr in zip(whitened, mask, strict=True)])


def test_reinforce_plus_plus_single_turn_matches_classic_loop():
    # On right-padded single-turn rows the classic loop (reset the running return after EOS)
    # and the multi-turn one agree.
    rewards = [[0.1, 0.0, 1.0, 0.0], [0.0, 0.2, 0.0, -1.0]]
    mask = [[1, 1, 1, 0], [1, 1, 1, 1]]
    gamma = 0.9
    classic = []
    for r_row, m_row in zip(rewards, mask, strict=True):
        running, row = 0.0, [0.0] * len(r_row)
        for i in reversed(range(len(r_row))):
            running = r_row[i] + gamma * running
            row[i] = running
            running *= m_row[i]
        classic.append(row)
    _, ret = algos.compute_reinforce_plus_plus_outcome_advantage(t(rewards), t(mask), gamma=gamma)
    close(ret, classic)


def test_reinforce_plus_plus_baseline_by_hand():
    # group a scores [1, 3] -> centred [-1, 1]; group b [5] -> mean 0 -> 5.
    # Tiled over sampled tokens: row0 -1,-1 ; row1 1,1,1 (with a gap) ; row2 5 ; then whitened.
    rewards = t([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    mask = [[1, 1, 0, 0], [1, 1, 0, 1], [1, 0, 0, 0]]
    adv, ret = algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, t(mask), ["a", "a", "b"])
    tiled = [[-1.0, -1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [5.0, 0.0, 0.0, 0.0]]
    whitened = whiten_ref(tiled, mask)
    expected = [[w * m for w, m in zip(wr, mr, strict=True)] for wr, mr in zip(whitened, mask, strict=True)]
    close(adv, expected)
    close(ret, expected)


# ---- registry and dispatch -----------------------------------------------------------


def test_registries_hold_verl_names():
    assert set(algos.ADV_ESTIMATOR_REGISTRY) == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "reinforce",  # ROLL's name (tests/compat/test_compat_roll.py)
        "gigpo",  # tests/trainer/test_turn_credit.py
        "remax",
        "opo",
        "grpo_passk",
        "gpg",  # tests/trainer/test_algos_estimators.py
    }
    assert set(algos.POLICY_LOSS_REGISTRY) == {"vanilla", "gspo", "topr", "gpg"}
    with pytest.raises(ValueError, match="Did you mean 'grpo'"):
        algos.get_adv_estimator_fn("grp")
    with pytest.raises(ValueError, match="Did you mean 'vanilla'"):
        algos.get_policy_loss_fn("vanila")


def test_compute_advantage_passes_only_what_each_estimator_takes():
    rewards, mask, index = _outcome_batch()
    inputs = dict(token_level_rewards=rewards, response_mask=mask, index=index, gamma=0.7, lam=0.9)
    grpo, _ = algos.compute_advantage("grpo", **inputs, norm_adv_by_std_in_grpo=False)
    close(grpo, algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)[0])
    rfpp, _ = algos.compute_advantage("reinforce_plus_plus", **inputs)
    close(rfpp, algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.7)[0])
    with pytest.raises(ValueError, match="needs values"):
        algos.compute_advantage("gae", **inputs)


# ---- loss aggregation ----------------------------------------------------------------


def test_agg_loss_every_mode_by_hand():
    loss = t([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
    mask = t([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    # row sums over the mask: 1+2+4 = 7 and 5; the third row is empty and counts nowhere
    close(algos.agg_loss(loss, mask, "token-mean"), 12 / 4)
    close(algos.agg_loss(loss, mask, "seq-mean-token-sum"), (7 + 5) / 2)
    close(algos.agg_loss(loss, mask, "seq-mean-token-mean"), (7 / 3 + 5 / 1) / 2, atol=1e-7)
    close(algos.agg_loss(loss, mask, "seq-mean-token-sum-norm"), (7 + 5) / 2 / 4)  # / mask.shape[-1]
    close(algos.agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10), 6 / 10)


def test_agg_loss_global_batch_and_errors():
    loss, mask = t([[1.0, 2.0, 3.0]]), t([[1, 1, 1]])
    # this rank holds 3 of 12 global tokens, 1 of 4 global sequences, with 2 ranks
    close(algos.agg_loss(loss, mask, "token-mean", dp_size=2, batch_num_tokens=12), 6 / 12 * 2)
    close(algos.agg_loss(loss, mask, "seq-mean-token-sum", dp_size=2, global_batch_size=4), 6 / 4 * 2)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        algos.agg_loss(loss, mask, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="Did you mean 'token-mean'"):
        algos.agg_loss(loss, mask, "token_mean")
    empty = t([[0, 0, 0]])
    for mode in algos.LOSS_AGG_MODES:
        close(algos.agg_loss(loss, empty, mode), 0.0)  # no tokens: 0, not NaN


# ---- policy losses -------------------------------------------------------------------


def _ppo_batch():
    # one row with mask [1,1,0,0,1,1,0]; old_log_prob -1 everywhere; log_prob = -1 + log(ratio)
    ratios = [1.5, 0.5, math.e**3, 0.1, 4.0, 1.0, 7.0]
    advantages = t([[2.0, -1.0, 5.0, -3.0, -2.0, 2.0, 1.0]])
    old = t([[-1.0] * 7])
    log_prob = old + torch.log(t([ratios]))
    return old, log_prob, advantages, t([GAP_MASK])


def test_vanilla_ppo_clip_and_dual_clip_by_hand():
    old, log_prob, adv, mask = _ppo_batch()
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = algos.compute_policy_loss_vanilla(old, log_prob, adv, mask)
    # eps 0.2, clip_ratio_c 3; sampled tokens only:
    # t0 A=+2 r=1.5: max(-3.0, -2*1.2=-2.4) = -2.4   clipped
    # t1 A=-1 r=0.5: max(0.5, 1*0.8=0.8) = 0.8        clipped; dual: min(3, 0.8) = 0.8
    # t4 A=-2 r=4:   max(8, 2.4) = 8 ; dual: min(2*3=6, 8) = 6   dual-clipped
    # t5 A=+2 r=1:   -2
    close(pg_loss, (-2.4 + 0.8 + 6.0 - 2.0) / 4)
    close(clipfrac, 2 / 4, atol=1e-8)
    close(clipfrac_lower, 1 / 4, atol=1e-8)
    close(ppo_kl, -(math.log(1.5) + math.log(0.5) + math.log(4.0) + 0.0) / 4, atol=1e-8)


def test_vanilla_asymmetric_clip_and_custom_dual_clip():
    old, log_prob, adv, mask = _ppo_batch()
    pg_loss, *_ = algos.compute_policy_loss_vanilla(
        old, log_prob, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=2.0
    )
    # t0: -2*1.3 = -2.6 ; t1: 1*0.9 = 0.9 ; t4: min(2*2=4, 8) = 4 ; t5: -2
    close(pg_loss, (-2.6 + 0.9 + 4.0 - 2.0) / 4)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, clip_ratio_c=1.0)


def test_vanilla_aggregation_modes_and_is_weights():
    old, log_prob, adv, mask = _ppo_batch()
    # token losses on sampled tokens: -2.4, 0.8, 6, -2 (sum 2.4, 4 tokens, padded length 7)
    seq_sum, *_ = algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, "seq-mean-token-sum")
    close(seq_sum, 2.4)
    norm, *_ = algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, "seq-mean-token-sum-norm")
    close(norm, 2.4 / 7)
    weights = t([[0.5, 2.0, 9.0, 9.0, 1.0, 1.0, 9.0]])
    weighted, *_ = algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, rollout_is_weights=weights)
    close(weighted, (-1.2 + 1.6 + 6.0 - 2.0) / 4)


def test_vanilla_log_ratio_clamped_at_20():
    old = t([[0.0, 0.0]])
    log_prob = t([[30.0, -30.0]])
    mask = t([[1, 0]])
    _, _, ppo_kl, _ = algos.compute_policy_loss_vanilla(old, log_prob, t([[1.0, 1.0]]), mask)
    close(ppo_kl, -20.0, atol=1e-6)  # log-ratio 30 clamped to 20
    _, _, ppo_kl, _ = algos.compute_policy_loss_vanilla(old, log_prob, t([[1.0, 1.0]]), t([[0, 1]]))
    close(ppo_kl, 20.0, atol=1e-6)


def _gspo_batch():
    # row 0: mask [1,1,0,1], log-ratios 0.1, 0.3, (5.0 observation), 0.2 -> sequence mean 0.2, A=+1
    # row 1: mask [1,1,0,0], log-ratios -0.4, 0 -> sequence mean -0.2, A=-1
    old = t([[-1.0, -2.0, -1.0, -0.5], [-1.0, -1.0, -1.0, -1.0]])
    log_ratio = t([[0.1, 0.3, 5.0, 0.2], [-0.4, 0.0, 3.0, 3.0]])
    log_prob = (old + log_ratio).requires_grad_(True)
    adv = t([[1.0] * 4, [-1.0] * 4])
    mask = t([[1, 1, 0, 1], [1, 1, 0, 0]])
    return old, log_prob, adv, mask


def test_gspo_sequence_ratio_and_stop_gradient_by_hand():
    old, log_prob, adv, mask = _gspo_batch()
    pg_loss, clipfrac, ppo_kl, lower = algos.compute_policy_loss_gspo(
        old, log_prob, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5
    )
    s0, s1 = math.exp(0.2), math.exp(-0.2)  # both inside [0.5, 1.5]: unclipped
    # seq-mean-token-mean: row 0 every token -1*s0, row 1 every token +1*s1
    close(pg_loss, (-s0 + s1) / 2)
    close(clipfrac, 0.0)
    close(lower, 0.0)
    close(ppo_kl, -(0.1 + 0.3 + 0.2 - 0.4 + 0.0) / 5)
    pg_loss.backward()
    # d/d log_prob_t of -A * s_it, with s_it = sg[s] * exp(log_prob_t - sg[log_prob_t]) -> -A * s,
    # then / tokens in the row / rows
    close(log_prob.grad, [[-s0 / 3 / 2, -s0 / 3 / 2, 0.0, -s0 / 3 / 2], [s1 / 2 / 2, s1 / 2 / 2, 0.0, 0.0]])


def test_gspo_default_clip_is_tiny_and_ignores_loss_agg_mode():
    old, log_prob, adv, mask = _gspo_batch()
    pg_loss, clipfrac, _, _ = algos.compute_policy_loss_gspo(old, log_prob, adv, mask, "token-mean")
    # defaults 3e-4 / 4e-4: s0 = e^0.2 -> 1.0004 with A=+1 ; s1 = e^-0.2 -> 0.9997 with A=-1
    close(pg_loss, (-1.0004 + 0.9997) / 2)
    close(clipfrac, 1.0, atol=1e-8)
    pg_loss.backward()
    assert torch.equal(log_prob.grad, torch.zeros_like(log_prob))  # every token clipped
    # bounds passed as None fall back to clip_ratio, as veRL does
    wide, *_ = algos.compute_policy_loss_gspo(
        old, log_prob, adv, mask, clip_ratio=0.5, clip_ratio_low=None, clip_ratio_high=None
    )
    close(wide, (-math.exp(0.2) + math.exp(-0.2)) / 2)


# ---- observation tokens never get gradient -------------------------------------------


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo"])
@pytest.mark.parametrize("loss_agg_mode", algos.LOSS_AGG_MODES)
def test_policy_loss_gives_zero_gradient_to_observation_tokens(loss_mode, loss_agg_mode):
    mask = t([GAP_MASK, [1, 1, 1, 0, 0, 0, 0]])
    old = t([[-1.0, -1.2, -0.3, -2.0, -0.7, -0.9, 0.0], [-0.5, -0.4, -0.3, 0.0, 0.0, 0.0, 0.0]])
    # garbage on observation / padding tokens: huge log-ratios and advantages
    log_prob = old + t([[0.05, -0.1, 40.0, -40.0, 0.02, 0.1, 25.0], [0.1, -0.05, 0.0, 9.0, 9.0, 9.0, 9.0]])
    log_prob.requires_grad_(True)
    adv = t([[1.0, -1.0, 1e6, -1e6, 0.5, 2.0, 1e6], [-0.5, 0.5, 1.0, 1e6, 1e6, 1e6, 1e6]])
    pg_loss, *_ = algos.get_policy_loss_fn(loss_mode)(
        old, log_prob, adv, mask, loss_agg_mode, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    kl_loss = algos.compute_kl_loss(log_prob, old - 0.3, mask, "low_var_kl", loss_agg_mode)
    (pg_loss + kl_loss).backward()
    grad = log_prob.grad
    assert torch.equal(grad[mask == 0], torch.zeros_like(grad[mask == 0]))
    assert torch.all(grad[mask == 1] != 0)


def test_vanilla_gradient_by_hand_and_zero_on_observations():
    old, log_prob, adv, mask = _ppo_batch()
    log_prob.requires_grad_(True)
    # clip_ratio 10: nothing clips; clip_ratio_c 1e9: no dual clip. loss = mean(-A * r) over 4 tokens
    pg_loss, *_ = algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, clip_ratio=10, clip_ratio_c=1e9)
    pg_loss.backward()
    # d/d log_prob of -A * exp(log_prob - old) = -A * r, divided by 4 tokens
    close(log_prob.grad, [[-2 * 1.5 / 4, 1 * 0.5 / 4, 0.0, 0.0, 2 * 4.0 / 4, -2 * 1.0 / 4, 0.0]], atol=1e-8)


def test_entropy_bonus_gives_zero_gradient_to_observation_tokens():
    logits = torch.randn(1, 7, 5, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    algos.compute_entropy_loss(logits, t([GAP_MASK])).backward()
    grad_per_token = logits.grad.abs().sum(dim=-1)[0]
    assert torch.equal(grad_per_token[t(GAP_MASK) == 0], torch.zeros(3, dtype=F64))
    assert torch.all(grad_per_token[t(GAP_MASK) == 1] > 0)


# ---- KL estimators -------------------------------------------------------------------


def test_kl_estimators_by_hand():
    lp, ref = t([[-1.0, -2.0, -0.5]]), t([[-1.5, -1.0, -0.5]])
    # d = logprob - ref = [0.5, -1, 0] ; x = ref - logprob = [-0.5, 1, 0]
    for name in ("kl", "k1"):
        close(algos.kl_penalty(lp, ref, name), [[0.5, -1.0, 0.0]])
    close(algos.kl_penalty(lp, ref, "abs"), [[0.5, 1.0, 0.0]])
    for name in ("mse", "k2"):
        close(algos.kl_penalty(lp, ref, name), [[0.125, 0.5, 0.0]])
    k3 = [[math.exp(-0.5) + 0.5 - 1, math.e - 1 - 1, 0.0]]  # e^x - x - 1
    for name in ("low_var_kl", "k3"):
        close(algos.kl_penalty(lp, ref, name), k3)
        close(algos.kl_penalty_forward(lp, ref, name), k3)


def test_low_var_kl_clamps():
    lp = t([[0.0, 0.0, 0.0, 0.0]])
    ref = t([[25.0, 3.0, -25.0, -8.0]])  # x = ref - logprob
    # x=25 -> clamped to 20 -> e^20 - 21 -> clamped to 10 ; x=3 -> e^3 - 4 = 16.09 -> 10
    # x=-25 -> clamped to -20 -> e^-20 + 19 -> 10 ; x=-8 -> e^-8 + 7, inside the bound
    close(algos.kl_penalty(lp, ref, "low_var_kl"), [[10.0, 10.0, 10.0, math.exp(-8) + 7]])


def test_kl_full_and_unknown_names():
    lp = t([[0.0]])
    with pytest.raises(NotImplementedError, match="every vocabulary token"):
        algos.kl_penalty(lp, lp, "full")
    with pytest.raises(ValueError, match="Did you mean 'low_var_kl'"):
        algos.kl_penalty(lp, lp, "lowvar_kl")


def test_kl_straight_through_keeps_value_takes_k2_gradient():
    lp = t([[-1.0, -2.0]]).requires_grad_(True)
    ref = t([[-1.5, -1.0]])
    est = algos.kl_penalty(lp, ref, "k3+")
    close(est.detach(), [[math.exp(-0.5) + 0.5 - 1, math.e - 2]])
    est.sum().backward()
    close(lp.grad, [[0.5, -1.0]])  # d/dlp of 0.5*(lp - ref)^2


def test_kl_loss_aggregates_over_sampled_tokens():
    lp = t([[-1.0, -2.0, -3.0, -0.5]])
    ref = t([[-1.5, -1.0, 0.0, -0.5]])
    mask = t([[1, 1, 0, 1]])
    close(algos.compute_kl_loss(lp, ref, mask, "kl"), (0.5 - 1.0 + 0.0) / 3)


# ---- KL in the reward and the controllers --------------------------------------------


def test_adaptive_kl_controller_updates_by_hand():
    ctrl = algos.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=1000)
    ctrl.update(current_kl=0.3, n_steps=100)  # error 2 -> clipped 0.2 -> x(1 + 0.2*100/1000)
    assert ctrl.value == pytest.approx(0.2 * 1.02, abs=1e-15)
    ctrl.update(current_kl=0.05, n_steps=100)  # error -0.5 -> clipped -0.2 -> x0.98
    assert ctrl.value == pytest.approx(0.2 * 1.02 * 0.98, abs=1e-15)
    ctrl.update(current_kl=0.11, n_steps=500)  # error 0.1 -> x(1 + 0.1*500/1000)
    assert ctrl.value == pytest.approx(0.2 * 1.02 * 0.98 * 1.05, abs=1e-15)
    fixed = algos.FixedKLController(kl_coef=0.3)
    fixed.update(current_kl=5.0, n_steps=100)
    assert fixed.value == 0.3


def test_get_kl_controller():
    assert isinstance(algos.get_kl_controller("fixed", kl_coef=0.01), algos.FixedKLController)
    adaptive = algos.get_kl_controller("adaptive", kl_coef=0.01, target_kl=0.2, horizon=50)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.01, 0.2, 50)
    with pytest.raises(ValueError, match="horizon"):
        algos.get_kl_controller("adaptive", horizon=0)
    with pytest.raises(ValueError, match="Did you mean 'adaptive'"):
        algos.get_kl_controller("adaptiv")


def test_apply_kl_penalty_by_hand():
    scores = t([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    old = t([[-1.0] * 4, [-1.0] * 4])
    ref = t([[-1.5, -4.0, -3.0, -1.0], [-1.0, -1.2, -1.0, -1.0]])
    mask = t([[1, 0, 1, 0], [1, 1, 0, 0]])
    # k1 = old - ref: row0 [0.5, 3 (observation, masked), 2, 0], row1 [0, 0.2, 0, 0]
    ctrl = algos.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=10)
    rewards, metrics = algos.apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty="kl")
    close(rewards, [[-0.05, 0.0, 0.8, 0.0], [0.0, 1.98, 0.0, 0.0]])
    # batch KL = mean of row means = ((0.5+2)/2 + (0+0.2)/2) / 2 = 0.675
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.675, abs=1e-7)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    # error 0.675/0.5 - 1 = 0.35 -> clipped 0.2 ; n_steps = batch size 2 -> x(1 + 0.2*2/10)
    assert ctrl.value == pytest.approx(0.104, abs=1e-9)


# ---- entropy, value loss, the actor loss ---------------------------------------------


def test_entropy_by_hand():
    # uniform over 2: ln 2 ; logits (0, ln 3) -> probs (0.25, 0.75): -(0.25 ln 0.25 + 0.75 ln 0.75)
    logits = t([[[0.0, 0.0], [0.0, math.log(3)]]])
    h2 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(algos.entropy_from_logits(logits), [[math.log(2), h2]])
    close(algos.entropy_from_logits(t([[[0.0, 0.0, 0.0, 0.0]]])), [[math.log(4)]])
    close(algos.compute_entropy_loss(logits, t([[1, 0]])), math.log(2))
    close(algos.compute_entropy_loss(logits, t([[1, 1]])), (math.log(2) + h2) / 2)


def test_log_probs_from_logits_by_hand():
    # logits (0, ln 3) -> probs (0.25, 0.75); targets 1 then 0
    logits = t([[[0.0, math.log(3)], [0.0, math.log(3)]]], dtype=torch.float32).requires_grad_()
    targets = torch.tensor([[1, 0]])
    log_probs, entropy = algos.log_probs_from_logits(logits, targets)
    close(log_probs, [[math.log(0.75), math.log(0.25)]], atol=1e-6)
    assert entropy is None
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    _, entropy = algos.log_probs_from_logits(logits, targets, with_entropy=True)
    close(entropy, [[h, h]], atol=1e-6)
    assert not entropy.requires_grad  # a logged statistic: no graph kept
    _, entropy = algos.log_probs_from_logits(logits, targets, with_entropy=True, entropy_grad=True)
    assert entropy.requires_grad  # an entropy bonus in the loss needs the gradient


def test_value_loss_by_hand():
    vpreds = t([[1.0, 2.0, 0.0, 1.0]])
    values = t([[0.5, 2.5, 0.0, 0.5]])
    returns = t([[2.0, 0.0, 9.0, 0.0]])
    mask = t([[1, 1, 0, 1]])
    # cliprange 0.2:
    # t0 clip 1.0 into [0.3, 0.7] -> 0.7: max((1-2)^2=1, (0.7-2)^2=1.69) = 1.69  clipped
    # t1 clip 2.0 into [2.3, 2.7] -> 2.3: max(4, 5.29) = 5.29                     clipped
    # t3 clip 1.0 into [0.3, 0.7] -> 0.7: max(1, 0.49) = 1
    vf_loss, vf_clipfrac = algos.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    close(vf_loss, 0.5 * (1.69 + 5.29 + 1.0) / 3)
    close(vf_clipfrac, 2 / 3, atol=1e-8)


def test_actor_loss_assembles_and_logs_every_term():
    old, log_prob, adv, mask = _ppo_batch()
    entropy = torch.full_like(log_prob, 2.0)
    loss, metrics = algos.compute_actor_loss(
        old,
        log_prob,
        adv,
        mask,
        entropy=entropy,
        entropy_coeff=0.01,
        use_kl_loss=True,
        ref_log_prob=log_prob - 0.1,
        kl_loss_coef=0.5,
        kl_loss_type="kl",
    )
    pg = (-2.4 + 0.8 + 6.0 - 2.0) / 4  # the vanilla hand example
    close(loss, pg - 0.01 * 2.0 + 0.5 * 0.1)
    assert metrics["actor/pg_loss"] == pytest.approx(pg)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    assert metrics["actor/entropy"] == pytest.approx(2.0)
    assert metrics["actor/kl_loss"] == pytest.approx(0.1)
    assert metrics["actor/kl_coef"] == 0.5
    with pytest.raises(ValueError, match="ref_log_prob"):
        algos.compute_actor_loss(old, log_prob, adv, mask, use_kl_loss=True)


# ---- turn-level credit ---------------------------------------------------------------


def _two_trajectories():
    two_turns = Trajectory(
        turns=[
            Turn(prompt_ids=[1, 2, 3], response_ids=[10, 11], logprobs=[-0.1, -0.2], reward=0.5),
            Turn(prompt_ids=[4, 5], response_ids=[12], logprobs=[-0.3], reward=0.0),
        ],
        outcome_reward=1.0,
    )
    one_turn = Trajectory(
        turns=[Turn(prompt_ids=[1, 2], response_ids=[20, 21, 22], logprobs=[-0.1] * 3, reward=0.25)],
        outcome_reward=-1.0,
    )
    return [two_turns, one_turn]


def test_trajectories_to_token_rewards_places_rewards_on_sampled_tokens():
    scores, mask = algos.trajectories_to_token_rewards(_two_trajectories(), turn_reward_coef=2.0)
    # response regions: [10, 11, 4, 5, 12] and [20, 21, 22] + 2 padding
    close(mask, [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]], atol=0)
    # turn reward 0.5*2 on token 11 ; outcome 1.0 on token 12 ; row 1: 0.25*2 - 1.0 on token 22
    close(scores, [[0.0, 1.0, 0.0, 0.0, 1.0], [0.0, 0.0, -0.5, 0.0, 0.0]], atol=1e-7)
    _, wide = algos.trajectories_to_token_rewards(_two_trajectories(), response_length=8)
    assert wide.shape == (2, 8)
    with pytest.raises(ValueError, match="response_length=4"):
        algos.trajectories_to_token_rewards(_two_trajectories(), response_length=4)
    failed = _two_trajectories()
    failed[1].status = "failed"
    with pytest.raises(ValueError, match="trajectory 1 is not trainable"):
        algos.trajectories_to_token_rewards(failed)


def test_rewards_on_unsampled_tokens_move_to_a_sampled_token():
    mask = t([[0, 1, 1, 0, 0, 1, 0]])
    # 0.5 before any sampled token -> first sampled (t=1) ; 2 on an observation (t=3) -> the
    # action before it (t=2) ; 1 on padding (t=6) -> the last sampled token (t=5)
    scores = algos.token_level_scores_from_rewards([[0.5, 0.0, 0.0, 2.0, 0.0, 0.0, 1.0]], mask)
    close(scores, [[0.0, 0.5, 2.0, 0.0, 0.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="no sampled token"):
        algos.token_level_scores_from_rewards([[1.0, 0.0]], t([[0, 0]]))


def test_outcome_reward_reaches_the_first_turn():
    # An outcome reward on the last turn must credit the first turn's tokens (GRPO and RF++).
    trajs = _two_trajectories()
    scores, mask = algos.trajectories_to_token_rewards(trajs, turn_reward_coef=0.0)
    grpo, _ = algos.compute_grpo_outcome_advantage(scores, mask, ["g", "g"], norm_adv_by_std_in_grpo=False)
    close(grpo, [[1.0, 1.0, 0.0, 0.0, 1.0], [-1.0, -1.0, -1.0, 0.0, 0.0]], atol=1e-7)  # mean 0
    _, returns = algos.compute_reinforce_plus_plus_outcome_advantage(scores, mask, gamma=1.0)
    close(returns, [[1.0, 1.0, 0.0, 0.0, 1.0], [-1.0, -1.0, -1.0, 0.0, 0.0]], atol=1e-7)
