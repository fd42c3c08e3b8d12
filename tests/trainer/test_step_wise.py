"""Per-turn samples (``trainer.step_wise_training``, and trajectories whose turns start new contexts):
each sample's tokens and logprobs are exactly what the policy server was sent and sampled, and the
episode's advantage (with GiGPO, each turn's own too) reaches every turn's sample."""

from __future__ import annotations

import os

import pytest
import torch

from agentgym.rollout.sources import FixedTrajectorySource
from agentgym.trainer.batch import build_batch
from agentgym.trainer.config import load_config
from agentgym.trainer.ppo_trainer import PPOTrainer
from agentgym.types import Trajectory, Turn
from tests.support.long_horizon import requests_by_logprob, run_episodes

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def row_turns(batch, r: int) -> list[int]:
    return sorted({k for k in batch["turn_index"][r].tolist() if k >= 0})


@pytest.mark.parametrize(("policy", "step_wise"), [("window", True), ("window", False), ("full", True)])
async def test_every_sample_is_what_the_server_saw(standin_server, policy, step_wise):
    trajs = await run_episodes(standin_server, policy, window=2, turns=6, tasks=2)
    seen = requests_by_logprob(standin_server.requests)
    batch, skipped = build_batch(trajs, pad_token_id=0, step_wise=step_wise)
    assert not skipped and batch.episodes is not None
    turns_per_row = [row_turns(batch, r) for r in range(len(batch))]
    if step_wise:
        assert len(batch) == sum(t.num_turns for t in trajs) and all(len(t) == 1 for t in turns_per_row)
    else:  # one row per token sequence: the first three turns share one, then each windowed turn has its own
        assert [len(t) for t in turns_per_row] == [3, 1, 1, 1] * 2
    r = 0
    for traj in trajs:
        for first, end in traj.segments(step_wise):
            start = int(batch["prompt_lengths"][r])
            length = int(batch["attention_mask"][r].sum())
            row_ids = batch["input_ids"][r, :length].tolist()
            mask = batch["response_mask"][r]
            sampled = batch["responses"][r][mask.bool()].tolist()
            logprobs = batch["rollout_log_probs"][r][mask.bool()].tolist()
            first_request = seen[traj.turns[first].logprobs[0]]
            assert row_ids[:start] == first_request["request"]["prompt"]  # the prompt the server was sent
            expected_ids, expected_lp = [], []
            for k in range(first, end):
                record = seen[traj.turns[k].logprobs[0]]
                assert record["request"]["prompt"] == row_ids[: len(record["request"]["prompt"])]  # later turns too
                expected_ids += record["token_ids"]
                expected_lp += record["logprobs"]
            assert sampled == expected_ids  # trained on exactly the sampled ids ...
            assert logprobs == pytest.approx(expected_lp, abs=1e-7)  # ... with the logprobs reported at sampling
            r += 1
    assert r == len(batch)


def episodes(rewards: list[float], turns: int = 3, group: str = "g") -> list[Trajectory]:
    """One group of single-sequence episodes, ``turns`` turns each, states shared by turn number."""
    out = []
    for i, reward in enumerate(rewards):
        out.append(
            Trajectory(
                turns=[
                    Turn(
                        prompt_ids=[5 + k, 6, 7] if k == 0 else [8, 9],
                        response_ids=[20 + i, 21 + k, 22],
                        logprobs=[-0.5, -0.25, -0.125],
                        reward=0.1 * k * (i % 2),
                        state_key=f"s{k}" if k < 2 else f"s{k}-{i % 2}",
                    )
                    for k in range(turns)
                ],
                outcome_reward=reward,
                group_id=group,
            )
        )
    return out


def trainer_for(estimator: str, step_wise: bool) -> PPOTrainer:
    cfg = load_config(
        env="sokoban",
        overrides=[
            "trainer.use_ray=false",
            "actor_rollout_ref.rollout.n=4",
            f"algorithm.adv_estimator={estimator}",
            f"trainer.step_wise_training={str(step_wise).lower()}",
        ],
    )
    return PPOTrainer(cfg, source=FixedTrajectorySource([[]]), pad_token_id=0, show_progress=False)


def per_turn_advantages(trainer: PPOTrainer, trajs: list[Trajectory]) -> dict[tuple[int, int], list[float]]:
    """Each (episode, turn)'s sampled tokens' advantages, from whatever rows hold them."""
    metrics: dict[str, float] = {}
    batch, layout = trainer.make_batch(trajs, metrics)
    trainer.compute_advantages(batch, trajs, metrics)
    out: dict[tuple[int, int], list[float]] = {}
    row_episode = []
    for i, traj in enumerate(trajs):
        row_episode += [i] * (len(traj.segments(True)) if batch.episodes is not None else 1)
    for r in range(layout.rows):
        mask = batch["response_mask"][r].bool()
        for k, a in zip(batch["turn_index"][r][mask].tolist(), batch["advantages"][r][mask].tolist()):
            out.setdefault((row_episode[r], k), []).append(a)
    return out


@pytest.mark.parametrize("estimator", ["grpo", "gigpo", "rloo"])
def test_the_episode_advantage_reaches_every_turn_sample(estimator):
    trajs = episodes([1.0, 0.0, 0.0, 1.0]) + episodes([0.0, 1.0, 0.5, 0.5], group="h")
    whole, step = trainer_for(estimator, False), trainer_for(estimator, True)
    try:
        one_row = per_turn_advantages(whole, trajs)
        per_turn = per_turn_advantages(step, trajs)
    finally:
        whole.loop.close()
        step.loop.close()
    assert set(per_turn) == {(i, k) for i in range(len(trajs)) for k in range(3)}  # every turn has a sample
    for key, values in one_row.items():
        assert per_turn[key] == pytest.approx(values, abs=1e-6), key  # the same advantage as one row per episode
    if estimator == "grpo":  # the episode's advantage, on every token of every turn's sample
        for i in range(len(trajs)):
            firsts = {per_turn[i, k][0] for k in range(3)}
            assert len(firsts) == 1 and next(iter(firsts)) != 0.0
    if estimator == "gigpo":  # the turn's own credit is kept: turns of one episode differ
        assert any(per_turn[i, 2][0] != per_turn[i, 0][0] for i in range(len(trajs)))


def test_windowed_trajectory_trains_without_the_switch():
    """A trajectory with a new-context turn gets a row per sequence even with step_wise_training=false."""
    traj = episodes([1.0, 0.0])
    traj[0].turns[2].prompt_ids = [1, 2, 3, 8, 9]
    traj[0].turns[2].new_context = True
    batch, _ = build_batch(traj, pad_token_id=0)
    assert len(batch) == 3 and batch.episodes is not None  # episode 0: two sequences; episode 1: one
    assert batch["input_ids"][1, : int(batch["prompt_lengths"][1])].tolist() == [1, 2, 3, 8, 9]
    view_mask = batch.episodes.view_mask()
    assert view_mask.sum().item() == sum(len(t.response_ids) for tr in traj for t in tr.turns)
    scores = batch.episodes.gather(batch["episode_position"], batch["token_level_scores"]).sum(-1)
    assert scores.tolist() == pytest.approx([1.0 + 0.0 + 0.0, 0.0 + 0.1 + 0.2])  # rewards kept, none twice
    back = batch.episodes.scatter(batch["episode_position"], torch.ones(2, batch.episodes.length))
    assert torch.equal(back, batch["response_mask"])


def fit_one_step(tmp_path, trajs: list[Trajectory], step_wise: bool, agg: str = "token-mean") -> dict[str, float]:
    cfg = load_config(
        env="sokoban",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[]",
            "trainer.use_ray=false",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=1",
            "algorithm.adv_estimator=grpo",
            "algorithm.filter_groups.enable=false",
            f"actor_rollout_ref.actor.loss_agg_mode={agg}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            f"trainer.step_wise_training={str(step_wise).lower()}",
        ],
    )
    trainer = PPOTrainer(cfg, FixedTrajectorySource([trajs]), pad_token_id=0, show_progress=False)
    try:
        return trainer.fit()["metrics"]
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_step_wise_takes_the_step_of_one_row_per_episode(tmp_path, agg):
    """Same episodes, same first update: each turn's row holds the prefix its tokens had in the episode's
    row, so with token-mean (and seq-mean-token-sum, which counts episodes, not rows) the loss and its
    gradient are the same, only computed on more, shorter rows."""
    trajs = episodes([1.0, 0.0, 0.0, 1.0])
    whole = fit_one_step(tmp_path / "whole", trajs, False, agg)
    step = fit_one_step(tmp_path / "step", trajs, True, agg)
    assert "batch/samples_per_episode" not in whole and step["batch/samples_per_episode"] == 3.0
    assert step["actor/pg_loss"] == pytest.approx(whole["actor/pg_loss"], abs=1e-5)
    assert step["actor/grad_norm"] == pytest.approx(whole["actor/grad_norm"], rel=1e-3)
    assert step["context/processed_tokens"] > step["sampled_tokens/mean"]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_saved_trajectories_keep_their_contexts(tmp_path, suffix):
    """A windowed trajectory read back from disk trains the same rows (a lost new_context would glue a
    whole context onto the previous turn's tokens)."""
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    from agentgym.rollout.storage import read_trajectories, write_trajectories

    trajs = episodes([1.0, 0.0])
    trajs[0].turns[2].prompt_ids = [1, 2, 3, 8, 9]
    trajs[0].turns[2].new_context = True
    write_trajectories(tmp_path / f"t{suffix}", trajs)
    back = read_trajectories(tmp_path / f"t{suffix}")
    assert [[t.new_context for t in tr.turns] for tr in back] == [[False, False, True], [False, False, False]]
    assert back[0].turn_context(2) == [1, 2, 3, 8, 9]


def test_a_teacher_scores_the_same_tokens_in_the_episode_view():
    """On-policy distillation with per-turn samples: the teacher's logprobs land on the same sampled tokens
    of the episode view as on one row per episode."""
    from agentgym.trainer.distillation import teacher_log_probs

    trajs = episodes([1.0, 0.0])
    for i, traj in enumerate(trajs):
        for k, turn in enumerate(traj.turns):
            if (i, k) != (1, 1):  # one turn no teacher scored
                turn.teacher_logprobs = [-(i + 1) * 0.1 - k * 0.01 - j * 0.001 for j in range(len(turn.response_ids))]
    whole, _ = build_batch(trajs, pad_token_id=0)
    split, _ = build_batch(trajs, pad_token_id=0, step_wise=True)
    view = PPOTrainer.episode_view(split)
    t_whole, s_whole = teacher_log_probs(trajs, whole)
    t_view, s_view = teacher_log_probs(trajs, view, sampled_only=True)
    for i in range(len(trajs)):
        assert t_whole[i][s_whole[i].bool()].tolist() == t_view[i][s_view[i].bool()].tolist()
        assert s_whole[i].sum() == s_view[i].sum()
    assert s_view[1].sum() == sum(len(t.response_ids) for t in trajs[1].turns) - len(trajs[1].turns[1].response_ids)
