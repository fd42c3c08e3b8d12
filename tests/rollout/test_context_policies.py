"""Context policies (agentgym/rollout/context.py): a history window or a summary keeps the prompt
bounded, never leaks a dropped turn into a later prompt, and every turn's stored prompt and reply are
exactly what the stand-in policy server was sent and sampled."""

from __future__ import annotations

import pytest

from agentgym.envs.base import default_summary
from agentgym.rollout.context import History, check_policy
from tests.support.long_horizon import TOK, requests_by_logprob, run_episodes


async def run_episode(server, policy: str, window: int, turns: int = 8):
    return (await run_episodes(server, policy, window, turns))[0]


def check_turns_are_what_the_server_saw(traj, requests) -> None:
    by_logprob = requests_by_logprob(requests)
    for k, turn in enumerate(traj.turns):
        record = by_logprob[turn.logprobs[0]]
        assert traj.turn_context(k) == record["request"]["prompt"]  # the whole prompt this turn was sampled from
        assert turn.response_ids == record["token_ids"] and turn.logprobs == record["logprobs"]


@pytest.mark.parametrize("policy", ["window", "compact"])
async def test_dropped_turns_never_reach_a_later_prompt(standin_server, policy):
    window = 2
    traj = await run_episode(standin_server, policy, window)
    assert traj.num_turns == 8
    check_turns_are_what_the_server_saw(traj, standin_server.requests)
    for k in range(traj.num_turns):
        prompt = TOK.decode(traj.turn_context(k))
        assert "TASK-go" in prompt and "SYS" in prompt  # the task is always kept
        kept = range(max(0, k - window), k)
        for j in range(k):  # reply j and the observation after it are in the prompt iff turn j is in the window
            assert (f"reply-{j}<|im_end|>" in prompt) == (j in kept), (k, j, prompt)
            assert (f"obs-{j + 1}<|im_end|>" in prompt) == (j in kept), (k, j, prompt)
        summary = f"SUMMARY of {k - window} turns"
        assert (summary in prompt) == (policy == "compact" and k > window)
        assert traj.turns[k].new_context == (k > window)
    # bounded: every windowed prompt is as long as the others (the turns are alike)
    lengths = traj.context_lengths()
    assert len(set(lengths[window + 2 :])) == 1


async def test_a_window_shrinks_to_the_sample_budget(standin_server):
    """A window of 6 turns that does not fit ``prompt_length + response_length``: the prompt keeps as many
    recent turns as fit, and the episode goes on (the budget is per sample, not per episode)."""
    limit = 120
    traj = (await run_episodes(standin_server, "window", 6, prompt_length=limit // 2, response_length=limit // 2))[0]
    check_turns_are_what_the_server_saw(traj, standin_server.requests)
    assert traj.num_turns == 8 and traj.status == "truncated"  # max_turns, not the budget, ended it
    assert all(n < limit for n in traj.context_lengths())
    assert any(t.new_context for t in traj.turns[:6])  # windowed before 6 turns had passed
    last = TOK.decode(traj.turn_context(7))
    assert "reply-6<|im_end|>" in last and "reply-0<|im_end|>" not in last


async def test_full_history_is_one_growing_sequence(standin_server):
    traj = await run_episode(standin_server, "full", 2)
    check_turns_are_what_the_server_saw(traj, standin_server.requests)
    assert traj.single_sequence and not any(t.new_context for t in traj.turns)
    assert "reply-0<" in TOK.decode(traj.turn_context(7))
    assert traj.metrics["template_mismatch"] == 0.0


async def test_windowed_episodes_cost_linear_tokens(standin_server):
    """Tokens processed per episode grow quadratically with the whole history, linearly with a window."""
    cost = {}
    for policy in ("full", "window"):
        for turns in (4, 8):
            cost[policy, turns] = (await run_episode(standin_server, policy, 2, turns)).processed_tokens()
    full_growth = cost["full", 8] - cost["full", 4]
    window_growth = cost["window", 8] - cost["window", 4]
    assert window_growth < full_growth
    per_turn = window_growth / 4
    assert cost["window", 8] <= cost["window", 4] + 4 * per_turn + 1


def test_history_and_default_summary():
    history = History()
    history.observe([{"role": "user", "content": "task"}])
    for k in range(3):
        history.reply(f"r{k}")
        history.observe([{"role": "user", "content": f"o{k}"}])
    assert history.prompt("full", 1) is None and history.prompt("window", 3) is None
    assert [m["content"] for m in history.prompt("window", 1)] == ["task", "r2", "o2"]
    compact = history.prompt("compact", 1)
    assert compact[1]["content"].startswith("Summary of the earlier turns:\n2 earlier turns not shown.")
    assert "o1" in compact[1]["content"] and "o0" not in compact[1]["content"]  # the default quotes the last one
    assert default_summary([{"role": "user", "content": "x" * 1000}]).count("x") == 400  # bounded
    with pytest.raises(ValueError, match="context_window"):
        check_policy("window", 0)
    with pytest.raises(ValueError, match="context_policy"):
        check_policy("sliding", 2)


def test_frozenlake_summarizes_the_moves_it_leaves_out():
    import agentgym

    env = agentgym.make("frozenlake", size=8, is_slippery=True, max_steps=50)
    history = [
        {"role": "assistant", "content": "<answer>Down</answer>"},
        {"role": "user", "content": "board"},
        {"role": "assistant", "content": "no idea"},
        {"role": "user", "content": "board"},
        {"role": "assistant", "content": "<answer>Right</answer>"},
    ]
    summary = env.summarize(history)
    assert summary == "3 earlier turns not shown. Moves asked for: Down Right. 1 replies had no readable move."
