"""ta/<game>: TextArena games, one player, against a fixed opponent, and in self-play."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.client import PolicyClient
from agentgym.model import load_tokenizer
from agentgym.rollout import RolloutConfig, RolloutRunner
from tests.support.adapter_checks import assert_token_exact, needs, train_two_steps

pytestmark = [pytest.mark.extras, needs("textarena", "textarena")]
TOK = load_tokenizer("tiny")


def play_directly(game: str, seed: int, moves: list[str]) -> dict[int, float]:
    """The same moves straight through TextArena: its own rewards."""
    import textarena as ta

    env = ta.make(game)
    env.reset(num_players=1 if game.startswith("GuessTheNumber") else 2, seed=seed)
    for move in moves:
        done, _ = env.step(move)
        if done:
            break
    rewards, _ = env.close()
    return rewards


def test_one_player_game_reward_is_textarenas():
    """A binary search through the hints wins; TextArena's own reward for the same moves is the same."""
    env = agentgym.make("ta/GuessTheNumber-v0")
    messages, info = env.reset(seed=4)
    assert messages[0]["role"] == "system" and "Guess The Number" in messages[1]["content"]
    low, high, played = 1, 20, []
    for _ in range(12):
        guess = (low + high) // 2
        played.append(f"[{guess}]")
        new, reward, terminated, truncated, info = env.step(played[-1])
        assert reward == 0.0
        if terminated or truncated:
            break
        assert new and new[0]["role"] == "user" and "[GAME]" in new[0]["content"]
        if "higher" in new[0]["content"]:
            low = guess + 1
        else:
            high = guess - 1
    assert terminated and info["outcome_reward"] == 1.0 and info["success"]
    assert info["outcome_reward"] == play_directly("GuessTheNumber-v0", 4, played)[0]


def test_two_players_against_a_scripted_opponent():
    env = agentgym.make("ta/TicTacToe-v0", opponent="first", seat=0)
    env.reset(seed=0)
    for move in ("[0]", "[3]"):  # the opponent takes the first free cell: 1, then 2
        new, _, terminated, _, _ = env.step(move)
        assert not terminated and "Player 1 placed their symbol (X)" in new[0]["content"]
    _, _, terminated, _, info = env.step("[6]")  # 0-3-6: a column
    assert terminated and info["outcome_reward"] == 1.0 and info["success"]
    assert info["outcome_reward"] == play_directly("TicTacToe-v0", 0, ["[0]", "[1]", "[3]", "[2]", "[6]"])[0]
    # seat 1: the opponent opens; the policy's first prompt already holds its move
    messages, info = agentgym.make("ta/TicTacToe-v0", opponent="first", seat=1).reset(seed=0)
    assert info["seat"] == 1 and "Player 0 placed their symbol (O) in cell 0" in messages[-1]["content"]


def test_opponent_can_be_a_second_policy_server(standin_server):
    """The stand-in's chat completions answer 'The answer is 72.': never a legal move, so the
    opponent loses on invalid moves; its requests went to that server."""
    env = agentgym.make("ta/TicTacToe-v0", opponent=standin_server.url, seat=0, opponent_kwargs={"max_tokens": 8})
    env.reset(seed=1)
    terminated, info = False, {}
    for move in ("[0]", "[1]", "[2]", "[3]"):
        _, _, terminated, _, info = env.step(move)
        if terminated:
            break
    assert terminated and info["outcome_reward"] == 1.0 and info["metrics"]["opponent_moves"] >= 2
    assert env.opponent.messages[0]["role"] == "system" and env.opponent.messages[-1]["role"] == "assistant"


async def test_self_play_gives_two_trajectories_with_opposite_rewards(standin_server):
    """Both seats answer '[4]': player 0 takes the centre, player 1's '[4]' is illegal twice and
    loses. Each game gives a trajectory per seat, in a group per seat, token-exact."""
    standin_server.token_ids = TOK.encode("[4]<|im_end|>", add_special_tokens=False)
    config = RolloutConfig(n=2, max_tokens=8, env_executor="inline")
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner("ta/TicTacToe-v0", client, "tiny", config, env_kwargs={"self_play": True})
        result = await runner.run(tasks=2)
    trajs = result.trajectories
    assert len(trajs) == 2 * 2 * 2  # 2 tasks x 2 games x 2 seats
    for group_id, group in result.groups().items():
        assert len(group) == 2 and group_id.endswith(("/player_0", "/player_1"))
    games: dict[tuple, dict[str, float]] = {}
    for t in trajs:
        assert t.status == "ok" and t.trainable
        games.setdefault((t.seed, t.task["sample"]), {})[t.task["agent"]] = t.outcome_reward
    for rewards in games.values():
        assert rewards == {"player_0": 1.0, "player_1": -1.0}  # decisive: opposite signs
    p0 = next(t for t in trajs if t.task["agent"] == "player_0")
    p1 = next(t for t in trajs if t.task["agent"] == "player_1")
    assert p0.num_turns == 1 and p1.num_turns == 2
    # the runner's one episode loop plays each seat: turn facts and state keys as in a single-agent episode
    assert all(turn.state_key and "cut" in turn.metrics for t in trajs for turn in t.turns)
    assert "You are Player 1" in p1.messages[1]["content"] and "You are Player 0" in p0.messages[1]["content"]
    # each seat's sequence is exactly what the server saw for that seat
    prompts = [r["request"]["prompt"] for r in standin_server.requests]
    for t in (p0, p1):
        sent: list[int] = []
        for turn in t.turns:
            sent += turn.prompt_ids
            assert sent in prompts and turn.response_ids == standin_server.token_ids
            sent += turn.response_ids
    assert result.metrics["episodes"] == 8 and result.metrics["failed"] == 0


@pytest.mark.slow
def test_two_step_self_play_train_is_token_exact(monkeypatch, tmp_path):
    """The tiny random model's replies are illegal moves: player 0 forfeits before player 1 moves
    (a seat that never acted gives no trajectory), so each game is decided: outcome -1 for player 0."""
    trajs, calls = train_two_steps(
        monkeypatch,
        tmp_path,
        "ta/TicTacToe-v0",
        "+env.kwargs.self_play=true",
        "env.executor=inline",
        "data.max_response_length=512",
        "actor_rollout_ref.rollout.max_tokens_per_turn=8",
    )
    assert trajs and all(t.task["agent"] in ("player_0", "player_1") and t.status == "ok" for t in trajs)
    assert all(t.outcome_reward in (-1.0, 1.0) for t in trajs)
    assert_token_exact(trajs, calls)
