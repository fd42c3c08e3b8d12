"""Demonstrations: experts in the TextEnv contract, demos written through the env, replayed, checked.

The rollout check drives the real RolloutRunner with a stand-in policy server that answers
each turn with the demo's assistant text, so "the same messages the runner would build" is
compared with what the runner actually built.
"""

from __future__ import annotations

import json
import random

import pytest

import agentgym
from agentgym.cli import main as cli_main
from agentgym.envs.base import NoExpertError, TextEnv, has_expert
from agentgym.envs.demos import DemoError, read_demos, write_demos
from agentgym.envs.first_letter import FirstLetterEnv
from agentgym.envs.sokoban import SokobanEnv
from agentgym.envs.sokoban_levels import Level, shortest_moves, solve
from agentgym.registry import UnknownNameError
from tests.support.shared_data import GSM8K_TEST

SOKOBAN_KW = {"offer_tools": False, "max_steps": 15}


def replay(record: dict) -> tuple[list[dict], dict]:
    """Play a demo's assistant messages through a fresh env; returns (messages, last info)."""
    env = agentgym.make(record["env"], **record["env_kwargs"])
    options = None if record["index"] is None else {"index": record["index"]}
    observation, info = env.reset(seed=record["seed"], options=options)
    messages = list(observation)
    for message in record["messages"]:
        if message["role"] != "assistant":
            continue
        messages.append(message)
        observation, _, terminated, truncated, info = env.step(message["content"])
        messages.extend(observation)
    return messages, info


# ---- the expert ------------------------------------------------------------------------------


def test_has_expert_tells_envs_that_can_demonstrate():
    assert has_expert(SokobanEnv) and has_expert(SokobanEnv()) and has_expert(agentgym.make("sokoban-6x6-2"))
    assert has_expert(FirstLetterEnv) is False and has_expert(FirstLetterEnv()) is False
    assert has_expert(lambda: SokobanEnv()) is None  # a factory: only building it tells
    with pytest.raises(NoExpertError):
        FirstLetterEnv().expert_action()
    assert issubclass(NoExpertError, NotImplementedError) and TextEnv.expert_action is not SokobanEnv.expert_action


def test_shortest_moves_is_move_optimal_and_valid():
    corridor = Level.from_text("#######\n#P_X_O#\n#######")
    assert shortest_moves(corridor) == ["Right", "Right", "Right"]
    assert shortest_moves(Level.from_text("#####\n#X__#\n#_P_#\n#__O#\n#####")) is None  # stuck box
    env = SokobanEnv(num_boxes=2, max_steps=200)
    for seed in range(60):
        env.reset(seed=seed)
        moves = shortest_moves(env.level)
        pushes = solve(env.level)
        assert moves and len(moves) <= len(pushes)
        for move in moves:
            *_, terminated, _, _ = env.step(f"<answer>{move}</answer>")
        assert terminated, f"seed {seed}"


def test_sokoban_expert_solves_in_turns_of_at_most_max_actions_and_recovers_off_plan():
    env = SokobanEnv(num_boxes=2, max_actions_per_turn=3, max_steps=100)
    rng = random.Random(0)
    for seed in range(40):
        env.reset(seed=seed)
        # a few random moves first, so the expert plans from boards that are not the level's start
        for _ in range(rng.randrange(3)):
            env.step(f"<answer>{rng.choice(['Up', 'Down', 'Left', 'Right'])}</answer>")
        terminated = False
        for _ in range(30):
            action = env.expert_action()
            if action is None:  # a random push made it unsolvable: the expert says so
                assert shortest_moves(env.current_level()) is None
                break
            assert action.startswith("<answer>") and 1 <= action.count("||") + 1 <= 3
            *_, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        if action is not None:
            assert terminated, f"seed {seed}"
            assert env.expert_action() is None  # the episode is over


def test_offer_tools_false_leaves_the_tool_schema_out():
    _, info = SokobanEnv(offer_tools=False).reset(seed=0)
    assert "tools" not in info
    _, info = SokobanEnv().reset(seed=0)
    assert info["tools"][0]["function"]["name"] == "move"


def test_current_level_follows_play():
    env = SokobanEnv()
    env.reset(options={"level": "#######\n#P_X_O#\n#######"})
    env.step("<answer>Right || Right</answer>")
    level = env.current_level()
    assert level.text() == "#######\n#__PXO#\n#######" == env.render()


# ---- writing and replaying demos ---------------------------------------------------------------


def test_sokoban_demos_replay_through_the_env_to_the_solved_state(tmp_path):
    path = tmp_path / "demos.jsonl"
    stats = write_demos("sokoban-6x6-2", n=40, path=path, seed=5, env_kwargs=SOKOBAN_KW, max_turns=3, progress=False)
    demos = read_demos(path, env="sokoban-6x6-2", env_kwargs=SOKOBAN_KW)
    assert stats.written == len(demos) == stats.solved and stats.episodes == 40
    assert stats.written >= 30  # a few need more than 3 turns of 5 moves: left out, counted
    assert [d["seed"] for d in demos] == sorted(d["seed"] for d in demos)
    assert {d["seed"] for d in demos} <= set(range(5, 45))
    for demo in demos:
        assert demo["env"] == "sokoban-6x6-2" and demo["success"] and demo["outcome_reward"] == 1.0
        assert demo["status"] == "ok" and 1 <= demo["turns"] <= 3 and demo["tools"] is None
        assert len(demo["turn_rewards"]) == demo["turns"] and demo["turn_rewards"][-1] > 10
        messages, info = replay(demo)
        assert info["success"] and info["outcome_reward"] == 1.0
        assert messages == demo["messages"]  # every message is what the env produced
        assert demo["messages"][-1]["content"].endswith("Solved! Every box is on a target.")
        roles = [m["role"] for m in demo["messages"]]
        assert roles[:2] == ["system", "user"] and roles.count("assistant") == demo["turns"]


def test_keep_failures_writes_the_episodes_the_expert_could_not_finish(tmp_path):
    path = tmp_path / "d.jsonl"
    stats = write_demos(
        "sokoban-6x6-2", n=30, path=path, env_kwargs={"max_steps": 4}, keep_failures=True, progress=False
    )
    demos = read_demos(path)
    assert len(demos) == 30 == stats.written and stats.solved < 30
    failed = [d for d in demos if not d["success"]]
    assert failed and all(d["status"] == "truncated" and d["outcome_reward"] == 0.0 for d in failed)


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason=f"GSM8K test data not found at {GSM8K_TEST}")
def test_gsm8k_demos_are_the_reference_solutions(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    kwargs = {"data_files": str(GSM8K_TEST)}
    write_demos("gsm8k", n=5, path=path, env_kwargs=kwargs, progress=False)
    demos = read_demos(path, env="gsm8k")
    rows = [json.loads(line) for line in GSM8K_TEST.open().readlines()[:5]]
    assert [d["index"] for d in demos] == [0, 1, 2, 3, 4]
    for demo, row in zip(demos, rows):
        reply = demo["messages"][-1]
        assert reply == {"role": "assistant", "content": row["answer"]} and "####" in reply["content"]
        assert demo["success"] and demo["turns"] == 1
        assert replay(demo)[1]["success"]


async def test_demo_messages_are_what_the_rollout_runner_builds(tmp_path, standin_server):
    """The runner, answered turn by turn with the demo's assistant text, builds the same messages."""
    from agentgym.client import PolicyClient
    from agentgym.model import load_tokenizer
    from agentgym.rollout import RolloutConfig, RolloutRunner, Task

    tok = load_tokenizer("tiny")
    path = tmp_path / "demos.jsonl"
    write_demos("sokoban-6x6-2", n=6, path=path, env_kwargs=SOKOBAN_KW, max_turns=3, progress=False)
    for demo in read_demos(path):
        replies = iter(m["content"] + "<|im_end|>" for m in demo["messages"] if m["role"] == "assistant")

        def policy(request, replies=replies):
            tokens = tok.encode(next(replies), add_special_tokens=False)
            return tokens, [-0.5] * len(tokens), "stop"

        standin_server.policy = policy
        async with PolicyClient(standin_server.url) as client:
            runner = RolloutRunner(
                "sokoban-6x6-2",
                client,
                "tiny",
                RolloutConfig(max_turns=3, max_tokens=64, env_executor="inline"),
                env_kwargs=SOKOBAN_KW,
            )
            traj = (await runner.run([Task(seed=demo["seed"])])).trajectories[0]
            await runner.aclose()
        assert traj.status == "ok" and traj.metrics["success"] == 1.0
        assert traj.messages == demo["messages"]


# ---- bad input ---------------------------------------------------------------------------------


def test_bad_input_is_refused_with_the_fix(tmp_path):
    out = tmp_path / "d.jsonl"
    with pytest.raises(DemoError, match="'first_letter' has no expert.*sokoban.*expert_action"):
        write_demos("first_letter", n=3, path=out)
    with pytest.raises(UnknownNameError, match="Did you mean 'sokoban'"):
        write_demos("sokobn", n=3, path=out)
    with pytest.raises(DemoError, match="positive number"):
        write_demos("sokoban", n=0, path=out)
    with pytest.raises(DemoError, match="could not build env 'sokoban'.*colour"):
        write_demos("sokoban", n=3, path=out, env_kwargs={"colour": "red"})
    with pytest.raises(DemoError, match="has no expert"):
        write_demos(FirstLetterEnv(), n=3, path=out)
    assert not out.exists()

    write_demos("sokoban", n=3, path=out, progress=False)
    with pytest.raises(DemoError, match="of env 'sokoban', not 'sokoban-6x6-2'.*agentgym demos --env sokoban-6x6-2"):
        read_demos(out, env="sokoban-6x6-2")
    with pytest.raises(DemoError, match="other env arguments.*max_steps"):
        read_demos(out, env="sokoban", env_kwargs={"max_steps": 15})
    with pytest.raises(DemoError, match="no demonstrations file.*agentgym demos"):
        read_demos(tmp_path / "missing.jsonl", env="sokoban")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"env": "sokoban", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DemoError, match="chat.jsonl:1: no assistant turn"):
        read_demos(chat)
    chat.write_text("{not json\n")
    with pytest.raises(DemoError, match="not a JSON line"):
        read_demos(chat)


# ---- the command line ----------------------------------------------------------------------------


def test_demos_command_and_envs_column(tmp_path, capsys):
    out = tmp_path / "demos.jsonl"
    code = cli_main(
        [
            "demos",
            "--env",
            "sokoban-6x6-1",
            "--n",
            "12",
            "-o",
            str(out),
            "--seed",
            "100",
            "--env-arg",
            "offer_tools=false",
            "--max-turns",
            "3",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"to {out}" in captured.out and "seeds 100..111" in captured.out
    demos = read_demos(out, env="sokoban-6x6-1", env_kwargs={"offer_tools": False})
    assert len(demos) == 12 and demos[0]["seed"] == 100
    assert "demos sokoban-6x6-1" in captured.err  # the progress bar

    assert cli_main(["demos", "--env", "first_letter", "--n", "2", "-o", str(out)]) == 2
    assert "has no expert" in capsys.readouterr().err
    assert cli_main(["demos", "--env", "sokoban", "--n", "2", "-o", str(out), "--env-arg", "oops"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err

    assert cli_main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["name", "package", "expert"]
    column = {line.split()[0]: line.split()[2] for line in lines[1:]}
    assert column["sokoban"] == column["gsm8k"] == "yes" and column["first_letter"] == "no"


def test_arithmetic_is_scored_like_gsm8k_and_its_expert_is_right(tmp_path):
    env = agentgym.make("arithmetic", digits=2, operands=3)
    messages, info = env.reset(seed=7)
    question = messages[-1]["content"]
    assert question.startswith("What is ") and info["answer"] == eval(question[8:-1])  # noqa: S307 - our own digits
    _, _, terminated, _, info = env.step(f"I think it is... #### {info['answer'] + 1}")
    assert terminated and not info["success"] and info["outcome_reward"] == 0.0
    env.reset(seed=7)
    _, _, _, _, info = env.step(env.expert_action())
    assert info["success"] and info["outcome_reward"] == 1.0
    env.reset(seed=7)
    assert env.random_action(random.Random(0)).startswith("#### ")
    stats = write_demos("arithmetic", 5, tmp_path / "a.jsonl", env_kwargs={"digits": 2}, progress=False)
    assert stats.written == stats.solved == 5
