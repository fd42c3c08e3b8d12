"""veRL's other estimators by name (remax, opo, grpo_passk, gpg) and GPG's loss, checked against numbers
worked by hand from veRL's ``core_algos``; ReMax's greedy baseline rolled out by the env source."""

from __future__ import annotations

import pytest
import torch

from agentgym.trainer import algos
from agentgym.types import Trajectory, Turn


def test_remax_is_the_reward_to_go_minus_the_greedy_score():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.5, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.float32)
    baselines = torch.tensor([0.5, 1.0, 2.0])
    adv, returns = algos.compute_advantage(
        "remax", token_level_rewards=rewards, response_mask=mask, reward_baselines=baselines, index=["a", "a", "b"]
    )
    # row 0: returns 1,1,1,0; minus 0.5 on the three sampled tokens
    assert adv[0].tolist() == pytest.approx([0.5, 0.5, 0.5, 0.0]) and returns[0].tolist() == [1, 1, 1, 0]
    # row 1: the reward sits on token 1: returns 2,2,0,0 and 2 - 1 on the sampled tokens
    assert adv[1].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0])
    # row 2, two turns with an observation between: reward-to-go 1.5, 1, 1; the baseline only on sampled tokens
    assert returns[2].tolist() == pytest.approx([1.5, 1.0, 1.0, 0.0])
    assert adv[2].tolist() == pytest.approx([-0.5, 1.0, -1.0, 0.0])


def test_remax_without_baselines_names_what_to_do():
    with pytest.raises(ValueError, match="reward_baselines"):
        algos.compute_advantage("remax", token_level_rewards=torch.ones(1, 2), response_mask=torch.ones(1, 2))
    no_baseline = [Trajectory(group_id="g", seed=1)]
    with pytest.raises(ValueError, match="greedy baseline"):
        algos.reward_baselines_of(no_baseline, 2)
    traj = Trajectory(group_id="g", seed=1, metrics={"reward_baseline": 0.25})
    assert algos.reward_baselines_of([traj], 3).tolist() == [0.25, 0.0, 0.0]  # padding rows: 0


def test_opo_subtracts_the_length_weighted_group_mean():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float32)
    adv, returns = algos.compute_advantage(
        "opo", token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b"]
    )
    # group a: lengths 3 and 1, scores 1 and 0: baseline (3 * 1 + 1 * 0) / 4 = 0.75
    assert adv[0].tolist() == pytest.approx([0.25] * 3) and adv[1].tolist() == pytest.approx([-0.75, 0, 0])
    assert adv[2].tolist() == pytest.approx([2.0, 2.0, 0.0])  # a group of one: baseline 0
    assert torch.equal(adv, returns)


def test_grpo_passk_rewards_only_the_best_reply_by_its_lead():
    rewards = torch.tensor([[1.0], [3.0], [2.0], [5.0], [5.0]])
    mask = torch.ones(5, 1)
    adv, _ = algos.compute_advantage(
        "grpo_passk",
        token_level_rewards=rewards,
        response_mask=mask,
        index=["a", "a", "a", "b", "b"],
        norm_adv_by_std_in_grpo=False,
    )
    assert adv[:, 0].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0, 0.0])  # 3 - 2; a tie leads by 0
    normed, _ = algos.compute_advantage(
        "grpo_passk", token_level_rewards=rewards[:3], response_mask=mask[:3], index=["a"] * 3
    )
    assert normed[1, 0] == pytest.approx(1.0 / (1.0 + 1e-6))  # the std of 1, 3, 2 is 1
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        algos.compute_advantage("grpo_passk", token_level_rewards=rewards[:1], response_mask=mask[:1], index=["a"])


def test_gpg_scales_the_centred_score_by_the_share_of_nonzero_scores():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]], dtype=torch.float32)
    adv, _ = algos.compute_advantage("gpg", token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b", "b"])
    # 2 of 4 scores are non-zero: alpha = 2; group a (1, 0) centres to +-0.5, group b (0, 2) to -+1
    assert adv.flatten().tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0, -2.0, 0.0, 2.0, 2.0])


def test_gpg_loss_is_the_plain_policy_gradient():
    old = torch.zeros(1, 2)
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = algos.compute_actor_loss(old, log_prob, adv, torch.ones(1, 2), loss_mode="gpg")
    loss.backward()
    assert float(loss.detach()) == pytest.approx((1.0 * 1 + -1.0 * 2) / 2)  # mean of -A * log_prob: (1 - 2) / 2
    assert log_prob.grad[0].tolist() == pytest.approx([-0.5, 0.5])  # no ratio, no clip: -A / tokens
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_the_env_source_rolls_out_one_greedy_episode_per_task_for_remax():
    import asyncio

    from agentgym.rollout.sources import EnvRolloutSource
    from agentgym.trainer.config import load_config

    cfg = load_config(
        env="first_letter",
        overrides=["algorithm.adv_estimator=remax", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2"],
        warn=False,
    )

    class Greedy:
        async def run(self, tasks):
            class Result:
                trajectories = [
                    Trajectory(
                        seed=t.seed,
                        outcome_reward=0.1 * t.seed,
                        turns=[Turn(prompt_ids=[1], response_ids=[2], logprobs=[0.0], reward=1.0)],
                    )
                    for t in tasks
                ]

            return Result()

    source = EnvRolloutSource.__new__(EnvRolloutSource)
    source.cfg, source.baseline_runner, source.last_metrics = cfg, Greedy(), {}

    class Task:
        def __init__(self, seed):
            self.seed = seed

    sampled = [Trajectory(seed=s, group_id=f"g{s}") for s in (3, 3, 5, 5)]
    asyncio.run(source.add_greedy_baselines([Task(3), Task(5)], sampled))
    turn_coef = float(cfg.algorithm.turn_reward_coef)
    expected = {3: turn_coef * 1.0 + 0.3, 5: turn_coef * 1.0 + 0.5}  # the trainer's score: coefficients applied
    assert [t.metrics["reward_baseline"] for t in sampled] == pytest.approx([expected[t.seed] for t in sampled])


def test_remax_trains_two_steps_on_an_env(tmp_path):
    import json
    from pathlib import Path

    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    cfg = load_config(
        env="first_letter",
        overrides=[
            "algorithm.adv_estimator=remax",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "trainer.use_ray=false",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
        ],
        warn=False,
    )
    summary = train(cfg, show_progress=False)
    rows = [json.loads(line) for line in Path(summary["metrics_file"]).read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "critic/advantages/mean" in rows[-1]
