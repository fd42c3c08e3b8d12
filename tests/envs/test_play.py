"""``agentgym play``: a scripted player sees boards, rewards and the episode summary."""

from __future__ import annotations

import io
import json

import gymnasium
import pytest

import agentgym
from agentgym import cli
from agentgym.envs.base import TextEnv
from agentgym.envs.play import play
from agentgym.envs.sokoban_levels import solve
from agentgym.registry import ENVS


def scripted(lines: list[str]):
    """An ``input_fn`` that replies with ``lines`` in order, then signals end of input."""
    queue = list(lines)

    def input_fn(prompt: str = "") -> str:
        if not queue:
            raise EOFError
        return queue.pop(0)

    return input_fn


def run(env_name: str, lines: list[str], **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    status = play(env_name, input_fn=scripted(lines), output=out, **kwargs)
    return status, out.getvalue()


def solution(seed: int) -> list[str]:
    env = agentgym.make("sokoban")
    env.reset(seed=seed)
    return solve(env.level)


def test_solving_sokoban_shows_rewards_and_the_summary():
    moves = solution(0)
    lines = [f"<answer>{' || '.join(moves[i : i + 5])}</answer>" for i in range(0, len(moves), 5)]
    status, transcript = run("sokoban", lines, seed=0)
    assert status == 0
    assert "== sokoban (seed 0)" in transcript and "[tool available] move" in transcript
    assert "--- system" in transcript and "Symbols: # wall" in transcript
    assert "[reward +" in transcript and "Solved!" in transcript
    summary = transcript.split("=== episode summary")[1]
    assert f"turns: {len(lines)}" in summary
    assert "status: terminated" in summary and "outcome reward: +1" in summary and "success: True" in summary
    assert "boxes_on_target: 1" in summary and "format_errors: 0" in summary


def test_json_lines_are_messages_so_tool_calls_can_be_typed():
    call = {"id": "c1", "type": "function", "function": {"name": "move", "arguments": json.dumps({"direction": "up"})}}
    status, transcript = run("sokoban", ["{not json", json.dumps({"tool_calls": [call]}), "quit"], seed=1)
    assert status == 0
    assert "not a valid JSON message" in transcript
    assert "--- tool" in transcript and "Moves: Up" in transcript
    assert "[reward " in transcript
    assert "turns: 1" in transcript and "=== episode summary" in transcript


def test_end_of_input_and_quit_stop_cleanly():
    for lines in ([], ["quit"], ["<answer>Left</answer>", "EXIT"]):
        status, transcript = run("sokoban-6x6-2", lines, seed=3)
        assert status == 0 and "=== episode summary" in transcript


def test_bad_replies_show_the_format_penalty():
    status, transcript = run("sokoban", ["Up please"], seed=2, env_kwargs={"format_penalty": -0.5})
    assert "Invalid reply: no <answer>...</answer> found" in transcript and "[reward -0.5]" in transcript


def test_unknown_env_is_an_error_with_a_suggestion():
    status, transcript = run("sokobn", [])
    assert status == 2 and "Did you mean 'sokoban'?" in transcript


class CountdownEnv(TextEnv):
    """Countdown: say numbers until zero (any TextEnv can be played)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = 2
        return [{"role": "user", "content": "count down from 2"}], {}

    def step(self, action):
        self.left -= 1
        done = self.left == 0
        info = {"outcome_reward": 1.0, "success": True, "metrics": {"said": str(action)}} if done else {}
        return [{"role": "user", "content": f"{self.left} to go"}], 0.5, done, False, info


@pytest.fixture
def countdown():
    agentgym.register("countdown-test", CountdownEnv)
    yield "countdown-test"
    ENVS._entries.pop("countdown-test", None)
    gymnasium.registry.pop("agentgym/Countdown-test-v0", None)


def test_any_text_env_can_be_played(countdown):
    status, transcript = run(countdown, ["2", "1", "never read"])
    assert status == 0
    assert "count down from 2" in transcript and "0 to go" in transcript
    assert "total reward: +1" in transcript and "success: True" in transcript and "said: 1" in transcript


def test_cli_play_reads_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("<answer>Up</answer>\nquit\n"))
    assert cli.main(["play", "--env", "sokoban", "--seed", "4", "--env-arg", "max_steps=7"]) == 0
    out = capsys.readouterr().out
    assert "Moves left: 7." in out and "Moves left: 6." in out and "=== episode summary" in out
