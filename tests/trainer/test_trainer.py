"""The PPO trainer: batches, masks, data-parallel equivalence, and learning on a real env."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random

import pytest
import torch

from agentgym.trainer import algos
from agentgym.trainer.batch import build_batch, pad_for_workers, update_plan
from agentgym.trainer.config import load_config
from agentgym.trainer.forward import policy_forward
from agentgym.trainer.worker_group import WorkerGroup
from agentgym.trainer.workers import PolicyWorker
from agentgym.types import Trajectory, Turn

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def make_trajectories(groups: int, n: int, seed: int = 0, turns: int = 2) -> list[Trajectory]:
    """Multi-turn trajectories with random tokens: prompt deltas (mask 0) between sampled turns."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        first_prompt = [rng.randrange(3, 600) for _ in range(rng.randrange(4, 9))]
        for _ in range(n):
            traj_turns = []
            for t in range(turns):
                prompt = first_prompt if t == 0 else [rng.randrange(3, 600) for _ in range(rng.randrange(1, 4))]
                response = [rng.randrange(3, 600) for _ in range(rng.randrange(1, 6))]
                traj_turns.append(
                    Turn(
                        prompt_ids=list(prompt),
                        response_ids=response,
                        logprobs=[-6.4] * len(response),
                        reward=rng.choice([0.0, 0.5]),
                    )
                )
            out.append(
                Trajectory(
                    turns=traj_turns, outcome_reward=rng.choice([0.0, 1.0]), group_id=f"g{g}", metrics={"success": 1.0}
                )
            )
    return out


def test_build_batch_layout_and_turn_level_credit():
    trajs = make_trajectories(2, 2, seed=1)
    batch, skipped = build_batch(trajs, pad_token_id=0, turn_reward_coef=0.5, outcome_reward_coef=2.0)
    assert not skipped and len(batch) == 4 and batch.uid == ["g0", "g0", "g1", "g1"]
    for i, traj in enumerate(trajs):
        ids, start = traj.token_ids(), traj.prompt_length()
        assert batch["input_ids"][i, : len(ids)].tolist() == ids
        assert int(batch["prompt_lengths"][i]) == start
        region = len(ids) - start
        assert batch["responses"][i, :region].tolist() == ids[start:]
        assert batch["response_mask"][i, :region].tolist() == traj.loss_mask()[start:]
        expected = traj.token_rewards(0.5, 2.0)[start:]
        assert batch["token_level_scores"][i, :region].tolist() == pytest.approx(expected)
        assert float(batch["token_level_scores"][i].sum()) == pytest.approx(
            0.5 * sum(t.reward for t in traj.turns) + 2.0 * traj.outcome_reward
        )


def test_untrainable_trajectories_keep_a_row_but_no_mask():
    trajs = make_trajectories(1, 3, seed=2)
    trajs[1].status = "failed"
    limit = min(trajs[0].response_length(), trajs[2].response_length())
    trajs[2].turns[-1].response_ids += [5] * (limit + 1 - trajs[2].response_length())
    trajs[2].turns[-1].logprobs = [-1.0] * len(trajs[2].turns[-1].response_ids)
    batch, skipped = build_batch(trajs, pad_token_id=0, max_response_length=limit)
    assert skipped == {"failed": 1, "response_too_long": 1}
    assert batch["valid"].tolist() == [True, False, False]
    assert batch["response_mask"][1:].sum() == 0 and batch["token_level_scores"][1:].abs().sum() == 0
    assert batch.uid[0] == "g0" and batch.uid[1].startswith("skipped")


def test_observation_tokens_get_no_gradient():
    """Advantages on observation tokens (mask 0) must not move the policy."""
    from agentgym.model import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm("tiny").train()
    batch, _ = build_batch(make_trajectories(2, 2, seed=3, turns=3), pad_token_id=0)
    t = batch.tensors
    log_prob, _ = policy_forward(model, t)
    log_prob.retain_grad()
    advantages = torch.randn_like(log_prob)  # deliberately non-zero everywhere, observations included
    loss, _ = algos.compute_actor_loss(log_prob.detach(), log_prob, advantages, t["response_mask"])
    loss.backward()
    observation = t["response_mask"] == 0
    assert observation.any()
    assert torch.all(log_prob.grad[observation] == 0)
    assert torch.any(log_prob.grad[~observation] != 0)


def test_trainer_log_probs_match_a_full_forward():
    from agentgym.model import load_causal_lm

    model = load_causal_lm("tiny")
    trajs = make_trajectories(2, 2, seed=4)
    batch, _ = build_batch(trajs, pad_token_id=0)
    with torch.no_grad():
        log_prob, entropy = policy_forward(model, batch.tensors, with_entropy=True)
        for i, traj in enumerate(trajs):
            ids = torch.tensor([traj.token_ids()])
            full = torch.log_softmax(model(ids).logits[0].float(), -1)
            start = traj.prompt_length()
            for t in range(len(traj.token_ids()) - start):
                token = traj.token_ids()[start + t]
                assert float(log_prob[i, t]) == pytest.approx(float(full[start + t - 1, token]), abs=1e-5)
    assert entropy.shape == log_prob.shape


def test_update_plan_gives_every_rank_an_equal_share_of_the_same_mini_batches():
    trajs = make_trajectories(3, 3, seed=5)  # 9 rows: not a multiple of 2
    batch, _ = build_batch(trajs, pad_token_id=0)
    rows = len(batch)
    padded, pads = pad_for_workers(batch, 2, [2])
    assert len(padded) % 2 == 0 and all(not padded["valid"][p] for p in pads)
    one = update_plan(padded["response_mask"], rows, pads, 2, 2, 1, shuffle=True, seed=7)
    two = update_plan(padded["response_mask"], rows, pads, 2, 2, 2, shuffle=True, seed=7)
    assert len(one[0]) == len(two[0]) == len(two[1]) == 4  # 2 epochs x 2 mini-batches
    for k in range(4):
        assert len(two[0][k]["rows"]) == len(two[1][k]["rows"])
        real = lambda r: [x for x in r if x < rows]  # noqa: E731
        assert sorted(real(two[0][k]["rows"] + two[1][k]["rows"])) == sorted(real(one[0][k]["rows"]))
        assert two[0][k]["global"]["batch_num_tokens"] == one[0][k]["global"]["batch_num_tokens"]


# ---- workers on Ray --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    if started:
        ray.shutdown()


def _update_once(world_size: int, use_ray: bool, strategy: str = "dp", tmp_path=None) -> dict[str, torch.Tensor]:
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"trainer.n_gpus_per_node={world_size}",
            f"trainer.use_ray={str(use_ray).lower()}",
            "trainer.device=cpu",
            f"actor_rollout_ref.actor.strategy={strategy}",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "trainer.cpu_threads_per_worker=1",
        ],
    )
    batch, _ = build_batch(make_trajectories(2, 4, seed=6), pad_token_id=0)
    mask = batch["response_mask"]
    adv, _ = algos.compute_advantage(
        "grpo", token_level_rewards=batch["token_level_scores"], response_mask=mask, index=batch.uid
    )
    batch["advantages"] = adv
    rows = len(batch)
    batch, pads = pad_for_workers(batch, world_size, [2])
    # two mini-batches: the second step also checks that AdamW's state agrees
    plan = update_plan(batch["response_mask"], rows, pads, 2, 1, world_size)
    group = WorkerGroup(PolicyWorker, cfg, world_size, use_ray)
    try:
        group.call("init_model", 10, False)
        metrics = group.call("update_actor", group.put(batch.tensors), per_rank=[(p,) for p in plan])
        assert all(math.isfinite(m["actor/grad_norm"]) for m in metrics)
        state = group.call("full_state_dict")[0]
        if strategy == "fsdp2" and tmp_path is not None:  # checkpoints (one layout for all strategies), HF export
            group.call("save_checkpoint", str(tmp_path / "ckpt"))
            assert sorted(p.name for p in (tmp_path / "ckpt" / "actor").iterdir()) == [
                "extra.pt",
                "model.pt",
                "optim.pt",
            ]
            assert _state_difference(torch.load(tmp_path / "ckpt" / "actor" / "model.pt"), state) == 0.0
            group.call("load_checkpoint", str(tmp_path / "ckpt"))
            group.call("save_hf", str(tmp_path / "hf"))
            from transformers import AutoModelForCausalLM

            exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
            assert all(torch.equal(exported[k], state[k]) for k in state)
        return state
    finally:
        group.shutdown()


def _state_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_two_gloo_workers_take_the_same_step_as_one(ray_session, tmp_path):
    reference = _update_once(1, use_ray=False)
    initial = __import__("agentgym.model", fromlist=["x"]).load_causal_lm("tiny").state_dict()
    moved = max(float((reference[k] - initial[k]).abs().max()) for k in reference)
    assert moved > 1e-4  # the step did something
    for strategy in ("dp", "fsdp2"):
        sharded = _update_once(2, use_ray=True, strategy=strategy, tmp_path=tmp_path)
        assert sharded.keys() == reference.keys()
        worst = max(float((sharded[k] - reference[k]).abs().max()) for k in reference)
        assert worst < 1e-6, f"{strategy}: parameters differ by {worst}"


# ---- learning ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_learns_first_letter(tmp_path, ray_session):
    """The tiny random model learns to start its reply with a vowel.

    Reward is 1 when the reply's first character is a vowel. A random model hits about 19%
    of the time (123 of the 640 tokens start with one). With 64 episodes per step the
    standard error of a step's mean reward is at most 0.0625, so a rise from the first two
    steps to the last three of more than 0.25 is more than four standard errors of the
    difference (sqrt(1/128 + 1/192) * 0.5 = 0.057) - not luck. The full path runs: env,
    rollout runner, embedded server, Ray actor worker, weight sync after every step.
    """
    from agentgym.trainer.run import train

    cfg = load_config(
        env="first_letter",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "trainer.seed=0",
            "trainer.total_training_steps=15",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
        ],
    )
    summary = train(cfg, show_progress=False)
    with open(summary["metrics_file"]) as f:
        rows = [json.loads(line) for line in f]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(rewards) == 15
    before = sum(rewards[:2]) / 2
    after = sum(rewards[-3:]) / 3
    assert before < 0.4, rewards
    assert after - before > 0.25, rewards
    versions = [r["weight_sync/version"] for r in rows if "weight_sync/version" in r]
    assert versions == list(range(1, 16))
    assert all(r["rollout/weight_version_lag"] == 0 for r in rows if "reward/mean" in r)  # on-policy every step
    assert rows[-1]["training/rollout_probs_diff_mean"] < 1e-3  # trainer and server agree on log-probs
    if importlib.util.find_spec("matplotlib"):
        assert summary["curves"] == str(tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 10_000


def test_loggers_write_jsonl_tensorboard_and_samples(tmp_path, capsys):
    from agentgym.tracking import Tracking, trajectory_metrics, write_samples

    tracking = Tracking(["console", "jsonl", "tensorboard"], tmp_path, "p", "e")
    trajs = make_trajectories(2, 2, seed=8)
    metrics = {**trajectory_metrics(trajs), "actor/pg_loss": 0.5, "timing_s/step": 1.25}
    tracking.log(metrics, 1)
    tracking.close()
    assert "step 1 | reward" in capsys.readouterr().out
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["step"] == 1 and row["actor/pg_loss"] == 0.5 and row["success_rate"] == 1.0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    write_samples(tmp_path / "samples.jsonl", trajs, 1, 2)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and samples[0]["turns"][0]["reward"] in (0.0, 0.5)


def test_weights_reach_a_server_given_by_url(tmp_path):
    """Servers someone else runs (rollout.server_urls) get each update through /update_weights_from_disk."""
    from agentgym.server.launch import start_embedded_server
    from agentgym.trainer.run import train

    with start_embedded_server("tiny") as server:
        cfg = load_config(
            env="first_letter",
            overrides=[
                f"trainer.default_local_dir={tmp_path}",
                "trainer.logger=[jsonl]",
                "trainer.use_ray=false",
                "trainer.total_training_steps=2",
                "trainer.val_before_train=false",
                f"actor_rollout_ref.rollout.server_urls=[{server.url}]",
                f"actor_rollout_ref.rollout.server_admin_key={server.admin_key}",
            ],
        )
        summary = train(cfg, show_progress=False)
        assert server.weight_version == 2
        trained = torch.load(tmp_path / "global_step_2" / "actor" / "model.pt")
        served = server.engine.model.state_dict()
        assert all(torch.equal(served[k].cpu(), trained[k]) for k in trained)
    assert summary["metrics"]["weight_sync/version"] == 2
    from agentgym.model.weights import push_dir

    assert not list(push_dir().glob(f"agentgym-policy-{os.getpid()}-*"))  # the push directory is cleaned up
