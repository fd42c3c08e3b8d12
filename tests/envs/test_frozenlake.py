"""FrozenLake: ROLL's text board and answer format over gymnasium's lake, an expert that solves it, and
``agentgym train --env frozenlake`` running the main job's stages."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentgym.envs.frozenlake import FrozenLakeEnv, parse_moves, random_lake, shortest_path

LAKE = ["SFFF", "FHFH", "FFFH", "HFFG"]  # gymnasium's 4x4 map


def play_expert(env: FrozenLakeEnv, seed: int) -> dict:
    env.reset(seed=seed)
    info: dict = {}
    for _ in range(env.max_steps):
        action = env.expert_action()
        if action is None:
            break
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return info


def test_the_board_and_the_legend_are_rolls():
    env = FrozenLakeEnv()
    messages, info = env.reset(options={"desc": LAKE})
    assert messages[1]["content"].startswith("P___\n_O_O\n___O\nO__G")
    assert "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal" in messages[0]["content"]
    assert "<answer>Right</answer>" in messages[0]["content"] and info["state_key"] == "P___\n_O_O\n___O\nO__G"


def test_moves_holes_goal_and_rewards():
    env = FrozenLakeEnv(format_penalty=-0.1)
    env.reset(options={"desc": LAKE})
    messages, reward, terminated, truncated, info = env.step("I think <answer>right</answer>")
    assert reward == 0.0 and not terminated and messages[0]["content"].splitlines()[1] == "_P__"
    messages, reward, terminated, _, info = env.step("no tag")
    assert reward == -0.1 and info["format_error"] and "Invalid reply" in messages[0]["content"]
    _, reward, terminated, _, info = env.step("<answer>Down</answer>")  # (1, 1) is a hole
    assert terminated and info["success"] is False and info["outcome_reward"] == 0.0
    assert env.render().splitlines()[1] == "_X_O" and info["metrics"]["in_hole"] == 1.0
    env.reset(options={"desc": LAKE})
    for move in ("Down", "Down", "Right", "Right", "Down", "Right"):
        _, reward, terminated, _, info = env.step(f"<answer>{move}</answer>")
    assert terminated and reward == 1.0 and info["success"] and info["outcome_reward"] == 1.0
    assert env.render().splitlines()[3] == "O__√"


def test_answers_are_parsed_strictly():
    assert parse_moves("<answer>Left</answer>", 1) == ([0], None)
    assert parse_moves("<answer>up || Down</answer>", 2) == ([3, 1], None)
    assert parse_moves("<answer>Up || Down</answer>", 1)[1].startswith("at most 1 move")
    assert "not a move" in parse_moves("<answer>Jump</answer>", 1)[1]
    assert parse_moves("<answer>Left</answer> then <answer>Up</answer>", 1) == ([3], None)  # the last tag counts


def test_the_step_budget_truncates():
    env = FrozenLakeEnv(max_steps=2)
    env.reset(options={"desc": LAKE})
    env.step("<answer>Up</answer>")
    _, _, terminated, truncated, info = env.step("<answer>Left</answer>")
    assert truncated and not terminated and info["success"] is False


def test_lakes_come_from_the_seed_and_always_have_a_path():
    env = FrozenLakeEnv(size=6)
    boards = [env.reset(seed=s)[1]["state_key"] for s in (1, 2, 1)]
    assert boards[0] == boards[2] != boards[1]
    fixed = FrozenLakeEnv(map_seed=7)
    assert fixed.reset(seed=1)[1]["state_key"] == fixed.reset(seed=2)[1]["state_key"]
    rng = random.Random(0)
    for _ in range(50):
        rows = random_lake(rng, 5, 0.6)
        start = "".join(rows).index("S")
        assert shortest_path(rows, start) is not None


def test_the_expert_solves_every_lake_on_ice_that_does_not_slip():
    env = FrozenLakeEnv(size=5, max_steps=30, max_actions_per_turn=2)
    assert all(play_expert(env, seed)["success"] for seed in range(30))


def test_on_slippery_ice_the_expert_beats_a_random_policy():
    env = FrozenLakeEnv(is_slippery=True)
    expert = sum(bool(play_expert(env, seed).get("success")) for seed in range(40))
    rng = random.Random(0)
    wins = 0
    for seed in range(40):
        env.reset(seed=seed)
        for _ in range(env.max_steps):
            _, _, terminated, truncated, info = env.step(env.random_action(rng))
            if terminated or truncated:
                wins += bool(info.get("success"))
                break
    assert expert >= 20 and expert > 2 * wins


def test_grid_lookup_and_vocab_change_the_symbols():
    env = FrozenLakeEnv(
        grid_lookup={0: "A", 1: ".", 2: "W", 3: "G", 4: "x", 5: "y"},
        grid_vocab={"A": "you", ".": "ice", "W": "water", "G": "goal"},
    )
    messages, _ = env.reset(options={"desc": LAKE})
    assert (
        messages[1]["content"].startswith("A...\n.W.W")
        and "A: you, .: ice, W: water, G: goal" in messages[0]["content"]
    )


def test_presets_are_registered():
    import agentgym

    slippery = agentgym.make("frozenlake-8x8-slippery")
    assert slippery.unwrapped.is_slippery and slippery.unwrapped.size == 8
    assert not agentgym.make("frozenlake").unwrapped.is_slippery


@pytest.mark.slow
def test_train_env_frozenlake_runs_the_main_job_stages(tmp_path):
    """Demos -> SFT -> RL -> the held-out table, with every stage shrunk to seconds."""
    from agentgym.cli import main

    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--env",
            "frozenlake",
            f"trainer.default_local_dir={run}",
            "warm_start.demos=32",
            "warm_start.sft.trainer.total_training_steps=2",
            "trainer.total_training_steps=1",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "held_out.num_tasks=4",
            "held_out.temperatures=[0.0]",
            "env.num_val_tasks=2",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
        ]
    )
    assert code == 0
    demos = (run / "warm_start" / "demos" / "demos.jsonl").read_text().splitlines()
    first = json.loads(demos[0])["messages"]
    assert len(demos) == 32 and any(m["role"] == "assistant" and "<answer>" in m["content"] for m in first)
    table = json.loads((run / "held_out.json").read_text())
    assert "after SFT" in json.dumps(table) and "after RL" in json.dumps(table)
    assert Path(run / "held_out.txt").is_file()
