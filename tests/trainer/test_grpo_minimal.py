"""examples/grpo_minimal.py: it runs, and its update is PPOTrainer's update on the same batch."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_minimal.py"


@pytest.fixture(scope="module")
def grpo():
    spec = importlib.util.spec_from_file_location("grpo_minimal", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo_minimal"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("grpo_minimal", None)


def test_grpo_minimal_trains_for_two_steps(grpo, capsys):
    history = grpo.main(["--steps", "2", "--prompts-per-step", "2", "--group-size", "4"])
    assert len(history) == 2
    for metrics in history:
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
        assert 0.0 <= metrics["reward/mean"] <= 1.0
    assert "step   2 | reward" in capsys.readouterr().out


def _fixed_batch(grpo, args):
    """One rollout of the tiny model, with rewards set so that every group has a spread."""
    from agentgym.model import load_causal_lm, load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.server.engine import Engine

    tokenizer = load_tokenizer(args.model)
    engine = Engine(load_causal_lm(args.model).eval(), tokenizer).start()
    try:
        trajectories = asyncio.run(grpo.rollout(engine, ChatTokenizer(tokenizer), args, [0, 1], version=0))
    finally:
        engine.stop()
    for i, traj in enumerate(trajectories):
        traj.outcome_reward = float(i % 3 == 0)
    return trajectories, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def test_one_update_matches_the_ppo_trainer_on_a_fixed_batch(grpo, tmp_path):
    from agentgym.model import load_causal_lm
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.trainer.config import load_config
    from agentgym.trainer.ppo_trainer import PPOTrainer
    from agentgym.trainer.workers import PolicyWorker

    args = grpo.Args(prompts_per_step=2, group_size=4)
    trajectories, pad_token_id = _fixed_batch(grpo, args)
    initial = load_causal_lm(args.model).state_dict()

    # the example's update
    model = load_causal_lm(args.model, dtype="float32", device="cpu")
    batch = grpo.make_batch(trajectories, pad_token_id)
    mine = grpo.update(model, grpo.adamw(model, args), batch, grpo.grpo_advantages(batch), args)
    updated = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # PPOTrainer's, in this process, its micro-batches accumulating the same gradient
    cfg = load_config(
        env=args.env,
        overrides=[
            "trainer.use_ray=false",
            "trainer.device=cpu",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.total_training_steps=1",
            f"data.train_batch_size={args.prompts_per_step}",
            f"actor_rollout_ref.rollout.n={args.group_size}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts_per_step}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            f"actor_rollout_ref.actor.optim.lr={args.lr}",
            f"actor_rollout_ref.actor.optim.weight_decay={args.weight_decay}",
            f"actor_rollout_ref.actor.clip_ratio={args.clip_ratio}",
            f"actor_rollout_ref.actor.grad_clip={args.grad_clip}",
            "algorithm.adv_estimator=grpo",
        ],
    )
    trainer = PPOTrainer(cfg, FixedTrajectorySource([trajectories]), pad_token_id=pad_token_id, show_progress=False)
    try:
        trainer.init_workers()
        theirs = trainer.train_step(1)
        trained = trainer.actor.call(PolicyWorker.full_state_dict)[0]
    finally:
        trainer.shutdown()

    assert mine["actor/pg_loss"] == pytest.approx(theirs["actor/pg_loss"], abs=1e-6)
    assert mine["actor/grad_norm"] == pytest.approx(theirs["actor/grad_norm"], rel=1e-4)
    assert mine["actor/grad_norm"] > 1e-3  # the batch has a learning signal
    step_mine = torch.cat([(updated[k] - initial[k]).flatten() for k in initial])
    step_theirs = torch.cat([(trained[k] - initial[k]).flatten() for k in initial])
    assert float(step_theirs.norm()) > 1e-3  # the step moved the weights
    assert float((step_mine - step_theirs).norm() / step_theirs.norm()) < 1e-3
