"""vf/<module>: verifiers environments (tests/support/vf_toy_envs.py, built with the real package) through
the adapter: single-turn, tools through agentgym's tool path, multi-turn; the reward is the rubric's."""

from __future__ import annotations

import asyncio
import json

import pytest

import agentgym
from agentgym.client import PolicyClient
from agentgym.model import load_tokenizer
from agentgym.rollout import RolloutConfig, RolloutRunner, Task
from tests.support.adapter_checks import assert_token_exact, needs, train_two_steps

pytestmark = [pytest.mark.extras, needs("verifiers", "verifiers")]
TOK = load_tokenizer("tiny")
ENV = "vf/tests.support.vf_toy_envs"


def verifiers_own_reward(kind: str, index: int, replies: list) -> float:
    """The same replies through verifiers' own ``run_rollout`` (its loop and its rubric), with a
    scripted model client written here: the reward verifiers gives those answers."""
    import verifiers as vf
    from verifiers.types import Response, ResponseMessage, ToolCall

    from tests.support import vf_toy_envs

    script = iter(replies)

    class Scripted(vf.Client):
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            reply = next(script)
            calls = (
                [
                    ToolCall(id=f"c{i}", name=name, arguments=json.dumps(args))
                    for i, (name, args) in enumerate(reply.get("calls", []))
                ]
                if isinstance(reply, dict)
                else []
            )
            text = reply.get("content", "") if isinstance(reply, dict) else reply
            return Response(
                id="x",
                created=0,
                model=model,
                message=ResponseMessage(
                    content=text,
                    tool_calls=calls or None,
                    finish_reason="tool_calls" if calls else "stop",
                    is_truncated=False,
                ),
            )

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

    env = vf_toy_envs.load_environment(kind=kind)
    row = dict(env.get_dataset()[index])
    output = asyncio.run(env.run_rollout(row, Scripted(None), "scripted", {}))
    return float(output["reward"])


@pytest.mark.parametrize("reply", ["<answer>7</answer>", "<answer>8</answer>", "no answer", "<answer>x</answer>"])
def test_single_turn_reward_is_the_rubrics(reply):
    env = agentgym.make(ENV, kind="single")
    messages, info = env.reset(options={"index": 2})
    assert messages == [
        {"role": "system", "content": "Add the numbers."},
        {"role": "user", "content": "What is 2 + 5? Answer in <answer></answer> tags."},
    ]
    new, reward, terminated, truncated, info = env.step(reply)
    assert (new, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["outcome_reward"] == verifiers_own_reward("single", 2, [reply])
    assert set(info["metrics"]) >= {"exact", "is_number"}


def test_tool_env_calls_the_tool_and_scores():
    env = agentgym.make(ENV, kind="tools")
    _, info = env.reset(options={"index": 1})
    (tool,) = info["tools"]
    assert tool["function"]["name"] == "add" and tool["function"]["parameters"]["required"] == ["a", "b"]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 3}'}}
        ],
    }
    new, _, terminated, _, _ = env.step(call)
    assert not terminated and new == [{"role": "tool", "content": "4", "tool_call_id": "call_0"}]
    _, _, terminated, _, info = env.step("It is 4")
    assert terminated and info["metrics"]["add_calls"] == 1.0
    assert (
        info["outcome_reward"]
        == verifiers_own_reward("tools", 1, [{"calls": [("add", {"a": 1, "b": 3})]}, "It is 4"])
        == 1.0
    )


def test_multi_turn_env_responses_come_back_as_messages():
    env = agentgym.make(ENV, kind="multi")
    env.reset(options={"index": 3})  # 3 + 7 = 10
    new, _, terminated, _, _ = env.step("<answer>5</answer>")
    assert not terminated and new == [{"role": "user", "content": "no, higher"}]
    new, _, terminated, _, _ = env.step("<answer>12</answer>")
    assert not terminated and new == [{"role": "user", "content": "no, lower"}]
    _, _, terminated, _, info = env.step("<answer>10</answer>")
    assert terminated and info["outcome_reward"] == 1.0
    assert info["outcome_reward"] == verifiers_own_reward(
        "multi", 3, ["<answer>5</answer>", "<answer>12</answer>", "<answer>10</answer>"]
    )
    env.reset(options={"index": 3})
    for guess in ("1", "2", "3"):  # max_turns=3 ends it unsolved
        _, _, terminated, _, info = env.step(f"<answer>{guess}</answer>")
    assert terminated and info["outcome_reward"] == 0.0


async def test_tool_calls_go_through_the_runners_tool_path(standin_server):
    """The model writes a Hermes <tool_call>; the runner turns it into tool_calls; verifiers runs the tool."""
    replies = iter(
        [
            '<tool_call>\n{"name": "add", "arguments": {"a": 0, "b": 1}}\n</tool_call><|im_end|>',
            "The sum is 1<|im_end|>",
        ]
        * 4
    )

    def policy(request):
        tokens = TOK.encode(next(replies), add_special_tokens=False)[: request["max_tokens"]]
        return tokens, [-0.1] * len(tokens), "stop"

    standin_server.policy = policy
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(ENV, client, "tiny", RolloutConfig(n=1, max_tokens=64), env_kwargs={"kind": "tools"})
        result = await runner.run([Task(seed=0, index=0)])
        await runner.aclose()
    (traj,) = result.trajectories
    assert traj.status == "ok" and traj.num_turns == 2 and traj.outcome_reward == 1.0
    roles = [m["role"] for m in traj.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[2]["tool_calls"][0]["function"]["name"] == "add" and traj.messages[3]["content"] == "1"


@pytest.mark.slow
def test_two_step_train_is_token_exact(monkeypatch, tmp_path):
    trajs, calls = train_two_steps(
        monkeypatch,
        tmp_path,
        ENV,
        "+env.kwargs.kind=single",
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.max_tokens_per_turn=16",
    )
    assert len(trajs) == 8 and all(t.env_id == ENV for t in trajs)
    assert_token_exact(trajs, calls)
