"""``trainer.total_training_minutes``: a run ends after the step that passes its time budget (the
long-horizon benchmark trains each context policy for the same wall clock with it)."""

from __future__ import annotations

import os

import pytest

from agentgym.config import ConfigError
from agentgym.rollout.sources import FixedTrajectorySource
from agentgym.trainer.config import load_config, validate
from agentgym.trainer.ppo_trainer import PPOTrainer
from tests.trainer.test_step_wise import episodes

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def overrides(tmp_path, minutes: str) -> list[str]:
    return [
        f"trainer.default_local_dir={tmp_path}",
        "trainer.logger=[jsonl]",
        "trainer.use_ray=false",
        "trainer.total_training_steps=3",
        f"trainer.total_training_minutes={minutes}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.save_hf_model=false",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=1",
        "algorithm.filter_groups.enable=false",
    ]


@pytest.mark.parametrize(("minutes", "steps"), [("1e-9", 1), ("null", 3)])
def test_the_run_stops_after_the_step_that_passes_the_budget(tmp_path, minutes, steps):
    cfg = load_config(env="sokoban", overrides=overrides(tmp_path, minutes))
    trainer = PPOTrainer(cfg, FixedTrajectorySource([episodes([1.0, 0.0, 1.0, 0.0])]), pad_token_id=0)
    try:
        summary = trainer.fit()
    finally:
        trainer.shutdown()
    assert summary["steps"] == summary["steps_run"] == steps
    assert summary["stopped_by_time"] is (steps < 3)
    logged = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(logged) == steps  # the last step taken is logged like any other


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["trainer.total_training_minutes=0"], "must be positive"),
        (["trainer.total_training_minutes=5", "actor_rollout_ref.hybrid_engine=false"], "asynchronous"),
    ],
)
def test_bad_budgets_are_refused(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        validate(load_config(env="sokoban", overrides=[f"trainer.default_local_dir={tmp_path}", *extra]))
