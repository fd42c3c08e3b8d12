"""Flat rewards: the share of groups whose trajectories all scored the same
(``batch/zero_variance_group_frac``) and the once-per-run warning when every group is flat,
so a run that cannot learn (the tiny random model on sokoban) says why."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from agentgym.rollout.sources import FixedTrajectorySource
from agentgym.trainer import algos
from agentgym.trainer.config import load_config
from agentgym.trainer.ppo_trainer import PPOTrainer
from agentgym.trainer.step_checks import (
    GroupRewardSpread,
    advantages_vanish,
    flat_rewards_warning,
    group_reward_spread,
)
from agentgym.types import Trajectory, Turn

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

FLAT = GroupRewardSpread(groups=4, flat=4, low=-0.3, high=-0.3)
MIXED = GroupRewardSpread(groups=4, flat=3, low=-0.3, high=-0.3)


# ---- the metric ---------------------------------------------------------------------------------


def test_mixed_groups_give_the_share_of_flat_groups():
    scores = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 3.0, 3.0]
    ids = ["a"] * 3 + ["b"] * 3 + ["c"] * 2 + ["d"] * 4
    assert group_reward_spread(scores, ids).zero_variance_frac == pytest.approx(2 / 4)  # a and c flat; b and d not
    spread = group_reward_spread(scores, ids)
    assert (spread.groups, spread.flat, spread.low, spread.high) == (4, 2, 0.5, 1.0)
    assert not spread.all_flat


def test_all_equal_rewards_give_one():
    scores = torch.tensor([-0.3] * 8)
    ids = [f"g{i // 4}" for i in range(8)]
    assert group_reward_spread(scores, ids).zero_variance_frac == 1.0
    assert group_reward_spread(scores, ids).all_flat


def test_rows_that_do_not_train_are_left_out_and_groups_of_one_do_not_count():
    scores = torch.tensor([1.0, 1.0, 0.0, 5.0, 7.0, 0.0])
    ids = ["a", "a", "a", "alone", "skipped-4", "pad-0"]
    valid = torch.tensor([True, True, False, True, False, False])
    spread = group_reward_spread(scores, ids, valid)
    assert (spread.groups, spread.flat, spread.singletons) == (1, 1, 1)  # "a" flat once row 2 is out
    assert spread.zero_variance_frac == 1.0
    assert group_reward_spread([1.0, 2.0], ["a", "b"]).zero_variance_frac is None  # rollout.n=1: no group to judge
    assert group_reward_spread([0.1 + 0.2, 0.3], ["a", "a"]).zero_variance_frac == 1.0  # float rounding is not variance
    with pytest.raises(ValueError):
        group_reward_spread([1.0, 2.0], ["a"])


def test_advantages_vanish_only_when_every_group_is_flat():
    assert advantages_vanish(FLAT, "grpo") and advantages_vanish(FLAT, "rloo")
    assert not advantages_vanish(MIXED, "grpo")
    assert not advantages_vanish(GroupRewardSpread(), "grpo")  # no group at all
    # a trajectory alone in its group keeps its score as advantage under grpo
    assert not advantages_vanish(
        GroupRewardSpread(groups=4, flat=4, singletons=1, low=0.0, high=0.0), "grpo", torch.ones(2, 3), torch.ones(2, 3)
    )
    # any other estimator: only when the advantages really are zero (gae's critic gives them spread)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert not advantages_vanish(FLAT, "gae", torch.tensor([[0.5, -0.2, 0.0], [0.1, 0.0, 0.0]]), mask)
    assert advantages_vanish(FLAT, "reinforce_plus_plus", torch.tensor([[0.0, 0.0, 9.0], [0.0, 9.0, 9.0]]), mask)
    assert not advantages_vanish(FLAT, "gae")


def test_the_warning_says_what_happened_and_what_to_try():
    text = flat_rewards_warning(FLAT, 1, "tiny", "sokoban", 4, 1.0)
    assert text.startswith("step 1: all 4 groups got identical rewards (value -0.3 for every trajectory)")
    for hint in (
        "advantage is zero",
        "tiny random model",
        "agentgym train --env first_letter",
        "actor_rollout_ref.model.path=",
        "actor_rollout_ref.rollout.n (now 4)",
        "actor_rollout_ref.rollout.temperature (now 1)",
    ):
        assert hint in text, hint
    spread = GroupRewardSpread(groups=2, flat=2, low=0.0, high=1.0)
    other = flat_rewards_warning(spread, 3, "Qwen/Qwen2.5-0.5B-Instruct", "first_letter", 8, 0.7)
    assert "from 0 to 1" in other and "Qwen/Qwen2.5-0.5B-Instruct" in other
    assert "--env first_letter" not in other and "tiny random model" not in other


# ---- the warning from the trainer ------------------------------------------------------------------


@pytest.fixture
def trainer():
    cfg = load_config(
        env="sokoban",
        overrides=["trainer.use_ray=false", "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"],
    )  # the group-relative warning
    t = PPOTrainer(cfg, source=FixedTrajectorySource([[]]), pad_token_id=0, show_progress=False)
    yield t
    t.loop.close()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agentgym.trainer" and r.levelno == logging.WARNING]


def test_all_flat_groups_warn_once_per_run(trainer, caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
        assert trainer.check_flat_rewards(1, FLAT)
        assert trainer.check_flat_rewards(2, FLAT)
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("step 1: all 4 groups got identical rewards (value -0.3")
    assert "--env first_letter" in warnings[0] and "rollout.n (now 4)" in warnings[0]
    assert trainer.flat_steps == 2


def test_a_group_with_spread_does_not_warn(trainer, caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
        assert not trainer.check_flat_rewards(1, MIXED)
    assert _warnings(caplog) == []
    assert trainer.flat_steps == 0


def _trajectories(rewards: list[list[float]]) -> list[Trajectory]:
    out = []
    for g, group in enumerate(rewards):
        for i, reward in enumerate(group):
            turn = Turn(prompt_ids=[5, 6, 7, 8 + g], response_ids=[20 + i, 30 + i], logprobs=[-6.4, -6.4])
            out.append(Trajectory(turns=[turn], outcome_reward=reward, group_id=f"g{g}"))
    return out


@pytest.mark.parametrize("rewards, flat", [([[0.0, 0.0], [0.0, 0.0]], True), ([[0.0, 0.0], [0.0, 1.0]], False)])
def test_the_training_loop_checks_every_step(tmp_path, caplog, rewards, flat):
    """Two steps in-process on the tiny model: the metric is logged each step, the warning
    comes once, and the summary says the run learned nothing only when every step was flat."""
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.stages.train_command import summary_text

    cfg = load_config(
        env="sokoban",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[]",
            "trainer.use_ray=false",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        ],
    )
    trainer = PPOTrainer(cfg, FixedTrajectorySource([_trajectories(rewards)]), pad_token_id=0, show_progress=False)
    try:
        with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
            summary = trainer.fit()
    finally:
        trainer.shutdown()
    assert summary["metrics"]["batch/zero_variance_group_frac"] == (1.0 if flat else 0.5)
    assert summary["steps_run"] == 2 and summary["flat_reward_steps"] == (2 if flat else 0)
    warnings = [w for w in _warnings(caplog) if "identical rewards" in w]
    assert len(warnings) == (1 if flat else 0), warnings
    assert ("the policy learned nothing" in summary_text(summary).splitlines()[0]) == flat


def test_the_cli_shows_trainer_warnings_above_the_progress_bar(monkeypatch, capsys):
    """``agentgym train`` sets up no logging: the trainer's warnings go to stderr through
    ``tqdm.write`` (so they do not land inside the progress bar), prefixed like its other messages."""
    from agentgym.stages.train_command import show_trainer_warnings

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as on the command line (pytest adds its own)
    logger = logging.getLogger("agentgym.trainer")
    handler = show_trainer_warnings()
    assert handler is not None
    try:
        logger.warning("%s", flat_rewards_warning(FLAT, 1, "tiny", "sokoban", 4, 1.0))
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.startswith("agentgym train: warning: step 1: all 4 groups got identical rewards"), err
    logging.getLogger().addHandler(logging.NullHandler())
    assert show_trainer_warnings() is None  # a program that set up logging keeps its own


def test_flat_means_what_grpo_means_by_equal_scores():
    """Scores equal up to float32 rounding (10.1 summed from different token splits) are one value
    to GRPO, which gives the group advantage 0; the flat-group count agrees."""
    rewards = torch.tensor([[10.1, 0.0], [10.0, 0.1], [9.9, 0.2], [7.1, 3.0]], dtype=torch.float32)
    scores = rewards.sum(-1)
    assert scores.max() != scores.min()
    adv, _ = algos.compute_grpo_outcome_advantage(rewards, torch.ones(4, 2), ["g"] * 4)
    assert torch.equal(adv, torch.zeros(4, 2))
    spread = group_reward_spread(scores, ["g"] * 4)
    assert spread.flat == spread.groups == 1
