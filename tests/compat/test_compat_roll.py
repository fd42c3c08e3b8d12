"""ROLL's algorithm keys, checked number for number, and ROLL's agentic Sokoban config translated and run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentgym.trainer import algos
from agentgym.trainer.algos.shaping import RunningMoments, normalize_scores, reward_norm

FIXTURES = Path(__file__).parent / "fixtures"


def test_reward_normalization_grouping_times_method():
    scores = torch.tensor([1.0, 3.0, 0.0, 4.0, 2.0, 2.0])
    groups = ["a", "a", "b", "b", "c", "c"]
    tags = ["x", "x", "x", "y", "y", "y"]

    def z(values):
        t = torch.tensor(values, dtype=torch.float32)
        return ((t - t.mean()) / (t.std() + 1e-6)).tolist()

    state = normalize_scores(scores, groups, tags, "state", "mean_std")
    assert state.tolist() == pytest.approx(z([1, 3]) + z([0, 4]) + [0.0, 0.0])  # flat group c -> 0
    inductive = normalize_scores(scores, groups, tags, "inductive", "mean")
    assert inductive.tolist() == pytest.approx([1 - 4 / 3, 3 - 4 / 3, -4 / 3, 4 - 8 / 3, 2 - 8 / 3, 2 - 8 / 3])
    batch = normalize_scores(scores, groups, tags, "batch", "asym_clip")
    assert batch.tolist() == pytest.approx(torch.tensor(z([1, 3, 0, 4, 2, 2])).clamp(-1, 3).tolist())
    assert normalize_scores(scores, groups, tags, "state", "identity").tolist() == scores.tolist()
    clipped = normalize_scores(torch.tensor([0.0, 0.0, 0.0, 10.0]), [0] * 4, [0] * 4, "batch", "asym_clip")
    assert max(clipped.tolist()) == pytest.approx(1.5) and min(clipped.tolist()) >= -1.0


def test_reward_norm_batch_group_running():
    scores = torch.tensor([1.0, 3.0, 5.0, 9.0])
    groups = ["a", "a", "b", "b"]
    assert reward_norm(scores, groups, "batch", shift=True).tolist() == pytest.approx([-3.5, -1.5, 0.5, 4.5])
    per_group = reward_norm(scores, groups, "group").tolist()
    assert per_group == pytest.approx(
        [-1 / (2**0.5 + 1e-6) * 1, 1 / (2**0.5 + 1e-6), -2 / (8**0.5 + 1e-6), 2 / (8**0.5 + 1e-6)], rel=1e-5
    )
    moments = RunningMoments()
    reward_norm(torch.tensor([0.0, 2.0]), groups[:2], "running", running=moments)
    second = reward_norm(torch.tensor([4.0, 6.0]), groups[:2], "running", shift=True, running=moments)
    assert moments.mean == pytest.approx(3.0) and second.tolist() == pytest.approx([1.0, 3.0])


def test_shaping_replaces_token_rewards_with_the_shaped_score_on_the_last_sampled_token():
    scores = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    valid = torch.tensor([True, True, False])
    out, metrics = algos.shape_rewards(
        scores, mask, ["g", "g", "h"], ["t"] * 3, method="mean", reward_clip=0.2, valid=valid
    )
    assert out[0].tolist() == pytest.approx([0, 0.2, 0, 0]) and out[1].tolist() == pytest.approx([0, 0, -0.2, 0])
    assert out[2].abs().sum() == 0 and metrics["critic/reward_clip_frac"] == 1.0
    same, none = algos.shape_rewards(scores, mask, ["g"] * 3, ["t"] * 3)
    assert same is scores and none == {}


def test_whiten_and_clip_advantages():
    adv = torch.tensor([[1.0, 2.0, 0.0], [3.0, 10.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.float32)
    whitened, _ = algos.postprocess_advantages(adv, mask, whiten=True)
    picked = whitened[mask.bool()]
    assert float(picked.mean()) == pytest.approx(0.0, abs=1e-5) and whitened[:, 2].abs().sum() == 0
    clipped, metrics = algos.postprocess_advantages(adv, mask, clip=2.5)
    assert clipped.max() == 2.5 and metrics["critic/advantage_clip_frac"] == 0.5


def test_reinforce_is_the_return_to_go():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 1, 0, 1]], dtype=torch.float32)
    adv, returns = algos.compute_advantage("reinforce", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    assert adv[0].tolist() == pytest.approx([0.5, 1.0, 2.0, 0.0, 2.0]) and torch.equal(adv, returns)


def test_topr_sft_and_dual_clip_switch():
    old = torch.zeros(2, 3)
    log_prob = torch.full((2, 3), 0.5, requires_grad=True)  # ratio e^0.5 > 1
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.ones(2, 3)
    scores = torch.tensor([1.0, 0.0])
    loss, metrics = algos.compute_actor_loss(
        old, log_prob, adv, mask, loss_mode="topr", episode_scores=scores, topr_negative_weight=2.0
    )
    loss.backward()
    # positive row: d/dlogp of -A*logp = -1 per token; negative row: -clip(ratio,0,1)=1 * A(-1) * 2 = +2; token-mean /6
    assert log_prob.grad[0].tolist() == pytest.approx([-1 / 6] * 3) and log_prob.grad[1].tolist() == pytest.approx(
        [2 / 6] * 3
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    plain, _ = algos.compute_actor_loss(old, log_prob.detach(), adv, mask)
    with_sft, sft_metrics = algos.compute_actor_loss(
        old, log_prob.detach(), adv, mask, sft_loss_coef=0.1, episode_scores=scores
    )
    assert sft_metrics["actor/sft_loss"] == pytest.approx(-0.5)  # -mean log_prob over the positive row
    assert float(with_sft - plain) == pytest.approx(0.1 * -0.5)
    big = torch.full((1, 1), 3.0)  # ratio e^3 ~ 20 with A < 0: the dual clip caps the loss at 3
    capped, _ = algos.compute_actor_loss(torch.zeros(1, 1), big, -torch.ones(1, 1), torch.ones(1, 1))
    uncapped, _ = algos.compute_actor_loss(torch.zeros(1, 1), big, -torch.ones(1, 1), torch.ones(1, 1), dual_clip=False)
    assert float(capped) == pytest.approx(3.0) and float(uncapped) == pytest.approx(float(torch.exp(big)))


# ---- the translated ROLL config runs -----------------------------------------------------------------


def test_roll_agentic_sokoban_translates_and_runs_two_steps(tmp_path):
    from agentgym.stages.config_command import translate_file
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    tr = translate_file("roll", str(FIXTURES / "roll_agentic_sokoban.yaml"))
    assert not tr.refused, tr.refused
    assert tr.get("data.train_batch_size") == 2 and tr.get("actor_rollout_ref.rollout.n") == 4
    assert tr.get("algorithm.adv_estimator") == "reinforce"
    assert tr.get("algorithm.reward_normalization") == {"grouping": "state", "method": "mean_std"}
    assert tr.get("env.custom_envs.LargerSokoban.kwargs.dim_room") == [8, 8]
    assert tr.get("env.custom_envs.FrozenLake") == {
        "env": "frozenlake",
        "max_turns": 3,
        "kwargs": {"max_steps": 3, "format_penalty": -0.01, "is_slippery": False},
    }
    assert tr.get("env.custom_envs.SokobanDifferentGridVocab.kwargs.grid_lookup")[5] == "A"
    path = tmp_path / "roll.yaml"
    path.write_text(tr.yaml())
    cfg = load_config(
        config_file=path,
        overrides=[
            "actor_rollout_ref.model.path=tiny",
            "trainer.use_ray=false",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.logger=[console]",
            "trainer.val_before_train=false",
        ],
        warn=False,
    )
    summary = train(cfg, show_progress=False)
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in Path(summary["metrics_file"]).read_text().splitlines()]
    last = rows[-1]
    assert last["step"] == 2 and last["episodes"] == 8  # 2 groups x 4
    assert "val/SimpleSokoban/reward/mean" in last and "val/LargerSokoban/reward/mean" in last
    assert "val/FrozenLake/reward/mean" in last and "val/SokobanDifferentGridVocab/success_rate" in last


def test_several_envs_by_tag_with_inductive_normalisation(tmp_path):
    """Two tags in one run: each tag its groups, metrics per tag, rewards normalised within a tag."""
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    cfg = load_config(
        env="first_letter",
        overrides=[
            "env.name=null",
            "+env.custom_envs.vowel={env: first_letter}",
            "+env.custom_envs.xyz={env: first_letter, kwargs: {targets: xyz, description: x y or z}}",
            "env.tags=[vowel,xyz]",
            "env.n_groups=[3,1]",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            "data.val_batch_size=2",
            "algorithm.reward_normalization.grouping=inductive",
            "algorithm.reward_normalization.method=mean_std",
            "algorithm.adv_estimator=reinforce",
            "trainer.use_ray=false",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=2",
            "trainer.save_freq=-1",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
        ],
        warn=False,
    )
    summary = train(cfg, show_progress=False)
    rows = [json.loads(line) for line in Path(summary["metrics_file"]).read_text().splitlines()]
    assert all("vowel/reward/mean" in r and "xyz/reward/mean" in r for r in rows)
    assert rows[-1]["episodes"] == 16 and "val/vowel/reward/mean" in rows[-1] and "val/xyz/success_rate" in rows[-1]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples


# ---- what ROLL's agentic YAMLs ask for, key by key --------------------------------------------------------


def roll(data):
    from agentgym.compat.roll import translate_roll

    return translate_roll(data)


def test_roll_lora_keys_train_adapters_instead_of_every_weight():
    tr = roll(
        {
            "actor_train": {"model_args": {"lora_target": "all-linear", "lora_rank": 32, "lora_alpha": 32}},
            "actor_infer": {"model_args": {"lora_target": "q_proj,v_proj", "lora_rank": 32, "lora_alpha": 32}},
        }
    )
    assert tr.get("actor_rollout_ref.model.lora_rank") == 32 and tr.get("actor_rollout_ref.model.lora_alpha") == 32
    assert tr.get("actor_rollout_ref.model.target_modules") is None  # all-linear
    assert any("actor_infer.model_args.lora_target" in note for note in tr.notes)  # they differ: said
    listed = roll({"actor_train": {"model_args": {"lora_target": "q_proj, v_proj", "lora_rank": 8}}})
    assert listed.get("actor_rollout_ref.model.target_modules") == ["q_proj", "v_proj"]


def test_the_turn_token_cap_is_the_smaller_one_and_a_conflict_is_reported():
    tr = roll({"max_tokens_per_step": 64, "actor_infer": {"generating_args": {"max_new_tokens": 128}}})
    assert tr.get("actor_rollout_ref.rollout.max_tokens_per_turn") == 64
    assert any("max_tokens_per_step=64" in note and "max_new_tokens=128" in note for note in tr.notes)
    same = roll({"max_tokens_per_step": 64, "actor_infer": {"generating_args": {"max_new_tokens": 64}}})
    assert same.get("actor_rollout_ref.rollout.max_tokens_per_turn") == 64 and not same.notes[1:]


def test_roll_gigpo_keys():
    tr = roll(
        {
            "adv_estimator": "gigpo",
            "step_reward_weight": 0.5,
            "episode_reward_weight": 2.0,
            "step_reward_gamma": 0.95,
            "reward_normalization": {"grouping": "traj_group_id", "method": "mean"},
        }
    )
    assert tr.get("algorithm.adv_estimator") == "gigpo" and tr.get("algorithm.gamma") == 0.95
    assert tr.get("algorithm.gigpo") == {"step_advantage_w": 0.5, "episode_advantage_w": 2.0, "mode": "mean_norm"}
    assert tr.get("algorithm.reward_normalization") is None  # gigpo normalises within its own groups


def test_env_config_keys_agentgym_cannot_honour_are_refused_not_dropped():
    tr = roll(
        {
            "train_env_manager": {"tags": ["S"]},
            "custom_envs": {
                "S": {
                    "env_type": "sokoban",
                    "env_config": {"dim_room": [6, 6], "teleport": True, "action_pattern": "<think>(.*?)</think>"},
                }
            },
        }
    )
    refused = dict(tr.refused)
    assert "custom_envs.S.env_config.teleport" in refused
    assert "think" in dict(tr.dropped)["custom_envs.S.env_config.action_pattern"]
    assert tr.get("env.custom_envs.S.kwargs.max_actions_per_turn") == 1  # ROLL reads one action a turn


def test_rolls_frozen_lake_default_is_slippery():
    tr = roll(
        {"train_env_manager": {"tags": ["F"]}, "custom_envs": {"F": {"env_type": "frozen_lake", "env_config": {}}}}
    )
    assert tr.get("env.custom_envs.F.kwargs.is_slippery") is True


def test_the_grid_vocab_sokoban_shows_rolls_symbols():
    from agentgym.envs.sokoban import SokobanEnv

    env = SokobanEnv(
        grid_lookup={0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"},
        grid_vocab={"W": "wall", ".": "empty", "G": "target", "B": "box", "A": "player"},
    )
    messages, info = env.reset(seed=3)
    board = messages[1]["content"].split("\n", 1)[1]
    assert set(board) <= set("W.GCBA@\n") and "A" in board and "#" not in board
    assert "W: wall, .: empty, G: target, B: box, A: player" in messages[0]["content"]
    plain = SokobanEnv()
    plain_board = plain.reset(seed=3)[0][1]["content"].split("\n", 1)[1]
    assert board == plain_board.translate(str.maketrans("#_O√XPS", "W.GCBA@"))  # the same level, other symbols
    reply, _, _, _, _ = env.step("<answer>Up</answer>")
    assert "#" not in reply[0]["content"].split("\n", 1)[1]
