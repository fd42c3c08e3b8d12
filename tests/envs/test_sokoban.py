"""Sokoban: Gymnasium conformance, solvable and reproducible levels, rewards, parsing, tools."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.sokoban import SokobanEnv, move_tool, parse_answer
from agentgym.envs.sokoban_levels import Level, generate_level, solve

CORRIDOR = """
#######
#P_X_O#
#######
"""


def answer(moves: list[str]) -> str:
    return "<answer>" + " || ".join(moves) + "</answer>"


def tool_call(direction, call_id: str = "call_1", as_dict: bool = False) -> dict:
    args = {"direction": direction}
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "move", "arguments": args if as_dict else json.dumps(args)},
    }


def play_solution(env: SokobanEnv, moves: list[str]) -> tuple[float, bool, bool, dict]:
    """Feed ``moves`` through ``step`` in turns of ``max_actions_per_turn``."""
    total, terminated, truncated, info = 0.0, False, False, {}
    n = env.max_actions_per_turn
    for i in range(0, len(moves), n):
        _, reward, terminated, truncated, info = env.step(answer(moves[i : i + n]))
        total += reward
        if terminated or truncated:
            break
    return total, terminated, truncated, info


# ---- Gymnasium ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gym_id",
    ["agentgym/Sokoban-v0", "agentgym/Sokoban-6x6-2-v0", "agentgym/Sokoban-8x8-2-v0", "agentgym/Sokoban-10x10-3-v0"],
)
def test_check_env_passes_in_full(gym_id):
    """The whole of ``gymnasium.utils.env_checker.check_env`` applies and passes, warnings
    included (they are raised as errors here): space checks (custom text spaces), reset
    return type, seed determinism and ``super().reset(seed=...)`` use, options, the passive
    reset/step checks, step determinism, no data shared between returns, and the ``ansi``
    render mode through the spec."""
    env = gymnasium.make(gym_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_gymnasium_make_works_right_after_import():
    code = (
        "import agentgym, gymnasium; env = gymnasium.make('agentgym/Sokoban-v0'); "
        "messages, info = env.reset(seed=0); print(messages[1]['content'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Boxes: 1." in out.stdout and "P" in out.stdout


def test_presets_are_env_specs_with_their_sizes():
    for name, dims, boxes in [
        ("sokoban", (6, 6), 1),
        ("sokoban-6x6-1", (6, 6), 1),
        ("sokoban-6x6-2", (6, 6), 2),
        ("sokoban-8x8-2", (8, 8), 2),
        ("sokoban-10x10-3", (10, 10), 3),
    ]:
        env = agentgym.make(name)
        env.reset(seed=1)
        assert (env.dim_room, env.num_boxes) == (dims, boxes)
        assert (env.level.height, env.level.width, len(env.level.boxes)) == (*dims, boxes)
    assert agentgym.env_spec("sokoban-8x8-2").description == "Sokoban 8x8, 2 boxes"
    assert isinstance(agentgym.env_spec("sokoban-6x6-1"), agentgym.EnvSpec)


# ---- levels ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dim_room", "num_boxes", "seeds"),
    [
        ((6, 6), 1, 1000),
        ((6, 6), 2, 1000),
        ((8, 8), 2, 1000),
        ((10, 10), 3, 200),
    ],
)
def test_generated_levels_are_solved_by_the_solver_and_by_playing(dim_room, num_boxes, seeds):
    env = SokobanEnv(dim_room=dim_room, num_boxes=num_boxes, max_steps=1000)
    for seed in range(seeds):
        env.reset(seed=seed)
        level = env.level
        assert (level.height, level.width) == dim_room
        assert len(level.boxes) == num_boxes
        assert not set(level.boxes) & set(level.targets), "reverse play must move every box off its target"
        moves = solve(level)
        assert moves, f"seed {seed}: no solution for\n{level.text()}"
        _, terminated, truncated, info = play_solution(env, moves)
        assert terminated and not truncated and info["success"], f"seed {seed}"


def test_same_seed_same_level_and_seeds_differ():
    env = SokobanEnv(num_boxes=2)
    boards = [env.reset(seed=seed)[0][1]["content"] for seed in range(200)]
    assert boards == [env.reset(seed=seed)[0][1]["content"] for seed in range(200)]
    assert len(set(boards)) >= 190
    other = SokobanEnv(num_boxes=2)
    assert other.reset(seed=7)[0] == env.reset(seed=7)[0]
    # An unseeded reset continues the seeded stream, deterministically.
    assert [env.reset()[1]["level"] for _ in range(3)] == [other.reset()[1]["level"] for _ in range(3)]


def test_generate_level_is_a_pure_function_of_the_rng():
    a = generate_level(random.Random(42), (8, 8), 2)
    b = generate_level(random.Random(42), (8, 8), 2)
    assert a == b and a.text() == b.text()


def test_solver_finds_none_for_a_stuck_box_and_handles_classic_symbols():
    stuck = Level.from_text("#####\n#X__#\n#_P_#\n#__O#\n#####")
    assert solve(stuck) is None
    xsb = Level.from_text("  #####\n###   #\n#.@$  #\n#######")  # XSB symbols, ragged outside
    assert xsb.text().splitlines() == ["#######", "###___#", "#OPX__#", "#######"]
    moves = solve(xsb)
    assert moves is not None and moves.count("Left") >= 3
    env = SokobanEnv()
    env.reset(options={"level": xsb})
    assert play_solution(env, moves)[1]


def test_level_text_round_trips_and_bad_boards_are_refused():
    level = generate_level(random.Random(0), (8, 8), 2)
    assert Level.from_text(level.text()) == level
    for bad, why in [
        ("#####\n#P__#\n#####", "as many targets"),
        ("#####\n#XO_#\n#####", "exactly one player"),
        ("#####\n#PXO_\n#####", "edge"),
        ("#####\n#PXO#\n##Z##", "unknown symbol"),
        ("#######\n#PXO#X#\n#####O#\n#######", "out of the player's reach"),
    ]:
        with pytest.raises(ValueError, match=why):
            Level.from_text(bad)


# ---- rewards and episode end -------------------------------------------------------------


def test_known_solution_gets_gym_sokoban_rewards():
    env = SokobanEnv()
    messages, _ = env.reset(options={"level": CORRIDOR})
    assert "#P_X_O#" in messages[1]["content"]
    messages, reward, terminated, truncated, info = env.step(answer(["Right"]))
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert "outcome_reward" not in info
    messages, reward, terminated, truncated, info = env.step(answer(["Right", "Right", "Left"]))
    assert reward == pytest.approx(-0.2 + 1.0 + 10.0)  # two moves, box on target, solved; Left not run
    assert terminated and not truncated
    assert info["outcome_reward"] == 1.0 and info["success"] is True
    assert info["metrics"] == {
        "boxes_on_target": 1,
        "num_boxes": 1,
        "actions": 3,
        "pushes": 2,
        "blocked_moves": 0,
        "format_errors": 0,
        "turns": 2,
    }
    assert messages[-1]["content"].endswith("Solved! Every box is on a target.")
    assert "#___P√#" in env.render()
    # Stepping a finished episode is harmless.
    messages, reward, terminated, _, _ = env.step(answer(["Left"]))
    assert reward == 0.0 and terminated and "episode is over" in messages[0]["content"]


def test_pushing_a_box_off_its_target_costs_one():
    env = SokobanEnv()
    env.reset(options={"level": "########\n#P√_X_O#\n########"})
    _, reward, *_ = env.step(answer(["Right"]))
    assert reward == pytest.approx(-0.1 - 1.0)
    assert "#_SXX_O#" in env.render()


def test_custom_rewards_are_used():
    env = SokobanEnv(penalty_for_step=-1.0, reward_box_on_target=2.0, reward_finished=5.0)
    env.reset(options={"level": CORRIDOR})
    _, reward, terminated, _, _ = env.step(answer(["Right"] * 3))
    assert terminated and reward == pytest.approx(-3.0 + 2.0 + 5.0)


def test_step_budget_truncates_and_counts_format_errors():
    env = SokobanEnv(max_steps=4)
    env.reset(options={"level": CORRIDOR})
    _, reward, terminated, truncated, _ = env.step(answer(["Left", "Up"]))  # both into walls
    assert reward == pytest.approx(-0.2) and not truncated
    _, reward, _, truncated, _ = env.step("no tags")
    assert reward == pytest.approx(-0.1) and not truncated
    messages, reward, terminated, truncated, info = env.step(answer(["Right", "Right", "Right"]))
    assert reward == pytest.approx(-0.1) and truncated and not terminated  # one step was left
    assert info["outcome_reward"] == 0.0 and info["success"] is False
    assert info["metrics"]["blocked_moves"] == 2 and info["metrics"]["format_errors"] == 1
    assert info["metrics"]["actions"] == 3 and info["metrics"]["turns"] == 3
    assert "No moves left" in messages[-1]["content"]


def test_step_before_reset_raises_reset_needed():
    with pytest.raises(ResetNeeded):
        SokobanEnv().step(answer(["Up"]))


# ---- parsing -----------------------------------------------------------------------------


def test_answers_are_case_insensitive_numeric_and_take_the_last_tag():
    assert parse_answer("<ANSWER> up ||LEFT|| 3 || 4</Answer>", 5) == ([0, 2, 2, 3], None, False)
    assert parse_answer("think <answer>Up</answer> no, <answer>Down</answer>", 5) == ([1], None, False)
    assert parse_answer("<answer>Up || </answer>", 5) == ([0], None, False)
    moves, error, cut = parse_answer(answer(["Up"] * 9), 5)
    assert moves == [0] * 5 and error is None and cut
    long_think = "x" * 100_000 + answer(["Right"])
    assert parse_answer(long_think, 5) == ([3], None, False)


def test_too_many_moves_are_cut_and_reported():
    env = SokobanEnv(max_actions_per_turn=2)
    env.reset(options={"level": CORRIDOR})
    messages, reward, *_ = env.step(answer(["Right", "Left", "Right", "Right"]))
    assert reward == pytest.approx(-0.2)
    assert messages[0]["content"].startswith("Only the first 2 moves were used.")


def _fuzz_replies(rng: random.Random) -> list:
    alphabet = "<>/|answerUpDownLeftRight{}[]\"': \n\t\\" + "√éü漢字😀\u200b\x00"
    replies: list = [
        None,
        "",
        " ",
        0,
        3.5,
        ["Up"],
        ("Up",),
        b"<answer>Up</answer>",
        np.array([1, 2]),
        "x" * (1 << 20),
        "<answer>" * 50_000,
        "<answer>Up" + "||" * 500_000,
        "<answer><answer>Up</answer></answer>",
        "<answer></answer>",
        "<answer>||||</answer>",
        "<answer>Jump</answer>",
        "<answer>上</answer>",
        "<answer>Up || 😀</answer>",
        {"role": "assistant", "content": None},
        {"content": [{"text": 5}]},
        {"content": 42},
        {"tool_calls": "move up"},
        {"tool_calls": [None]},
        {"tool_calls": [{"function": None}]},
        {"tool_calls": [{"function": {"name": "jump", "arguments": "{}"}}]},
        {"tool_calls": [{"function": {"name": "move", "arguments": "{not json"}}]},
        {"tool_calls": [{"function": {"name": "move", "arguments": "[1, 2]"}}]},
        {"tool_calls": [{"function": {"name": "move", "arguments": json.dumps({"direction": 5})}}]},
        {"tool_calls": [{"function": {"name": "move", "arguments": json.dumps({"direction": []})}}]},
        {"tool_calls": [{"function": {"name": "move", "arguments": json.dumps({"direction": [[{}]]})}}]},
        {"tool_calls": [{"function": {"name": "move", "arguments": "x" * (1 << 20)}}]},
        {"tool_calls": [{"id": 7, "function": {"name": "move", "arguments": None}}]},
        {"tool_calls": np.array([1])},
        {"tool_calls": {"a": 1}},
    ]
    for _ in range(300):
        n = rng.choice([1, 5, 30, 200])
        text = "".join(rng.choice(alphabet) for _ in range(n))
        replies.append(text if rng.random() < 0.7 else f"<answer>{text}</answer>")
    return replies


def test_fuzzed_replies_never_raise_and_cost_the_format_penalty():
    env = SokobanEnv(max_steps=10_000, format_penalty=-0.25)
    env.reset(seed=0)
    for reply in _fuzz_replies(random.Random(0)):
        messages, reward, terminated, truncated, info = env.step(reply)
        assert isinstance(messages, list) and messages and isinstance(messages[-1]["content"], str)
        assert env.render() in messages[-1]["content"]
        if info["format_error"]:
            assert reward == -0.25 and messages[-1]["content"].startswith("Invalid reply:")
        if terminated or truncated:
            env.reset(seed=0)


def test_unreadable_reply_says_how_to_answer():
    env = SokobanEnv()
    env.reset(seed=0)
    messages, reward, *_ = env.step("<answer>Jump</answer>")
    text = messages[0]["content"]
    assert reward == pytest.approx(-0.1)
    assert "'Jump' is not a move" in text and "<answer>Up || Left</answer>" in text


# ---- the move tool -----------------------------------------------------------------------


def test_move_tool_schema_is_offered():
    env = SokobanEnv()
    _, info = env.reset(seed=0)
    assert info["tools"] == [move_tool()] == SokobanEnv.tools
    assert info["tools"][0]["function"]["name"] == "move"
    assert info["tools"][0] is not env.reset(seed=0)[1]["tools"][0]


def test_move_tool_plays_and_answers_every_call():
    env = SokobanEnv()
    env.reset(options={"level": CORRIDOR})
    calls = [tool_call("right", "a"), tool_call(["Right"], "b", as_dict=True)]
    messages, reward, terminated, _, _ = env.step({"role": "assistant", "content": None, "tool_calls": calls})
    assert [m["role"] for m in messages] == ["tool", "tool"]
    assert [m["tool_call_id"] for m in messages] == ["a", "b"]
    assert messages[0]["content"] == "ok" and "#__PXO#" in messages[1]["content"]
    assert reward == pytest.approx(-0.2) and not terminated
    messages, reward, terminated, _, info = env.step({"role": "assistant", "tool_calls": [tool_call(["right"])]})
    assert terminated and info["success"] and reward == pytest.approx(-0.1 + 1 + 10)


def test_broken_tool_call_is_answered_with_the_error():
    env = SokobanEnv()
    env.reset(options={"level": CORRIDOR})
    calls = [tool_call("up", "a"), {"id": "b", "function": {"name": "teleport", "arguments": "{}"}}]
    messages, reward, *_ = env.step({"role": "assistant", "content": "", "tool_calls": calls})
    assert [m["tool_call_id"] for m in messages] == ["a", "b"]
    assert messages[0]["content"] == "not run"
    assert "unknown tool 'teleport'" in messages[1]["content"] and reward == pytest.approx(-0.1)
