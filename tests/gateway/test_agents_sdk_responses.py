"""The OpenAI Agents SDK's default model class (``OpenAIResponsesModel``, the Responses API) runs a tool
loop against the tiny model, on the policy server and through the gateway, which records it token-exactly.

The tiny model's text is random, so constrained decoding drives the loop: the first call must call the
calculator (``tool_choice="required"``); the tool is then spent (``is_enabled``), so the next call is the
structured final answer (``output_type``: ``text.format`` json_schema), which ends."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Annotated, Any

import httpx
import pytest
from pydantic import BaseModel, Field

from agentgym.gateway.serve import start_gateway
from agentgym.model import load_tokenizer
from agentgym.server.tool_calls import parse_tool_calls
from agentgym.types import Trajectory

agents = pytest.importorskip("agents")  # the agents extra


class Answer(BaseModel):
    answer: str = Field(pattern=r"^#### -?[0-9]{1,6}$")


class Budget:
    def __init__(self) -> None:
        self.calls_left = 1
        self.expressions: list[str] = []


@agents.function_tool(is_enabled=lambda ctx, agent: ctx.context.calls_left > 0)
def calculator(ctx: agents.RunContextWrapper[Budget], expression: Annotated[str, Field(max_length=30)]) -> str:
    """Evaluate an arithmetic expression."""
    ctx.context.calls_left -= 1
    ctx.context.expressions.append(expression)
    return "42"


def run_agent(base_url: str, api_key: str, streamed: bool) -> tuple[Any, Budget]:
    from openai import AsyncOpenAI

    async def go() -> tuple[Any, Budget]:
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        agent = agents.Agent(
            name="solver",
            instructions="Solve the problem with the calculator, then answer.",
            tools=[calculator],
            output_type=Answer,
            model=agents.OpenAIResponsesModel(model="tiny", openai_client=client),  # the SDK's default class
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=100, parallel_tool_calls=False),
        )
        budget, config = Budget(), agents.RunConfig(tracing_disabled=True)
        if streamed:
            result = agents.Runner.run_streamed(agent, "What is 6 * 7?", context=budget, max_turns=4, run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await agents.Runner.run(agent, "What is 6 * 7?", context=budget, max_turns=4, run_config=config)
        await client.close()
        return result, budget

    return asyncio.run(go())


def check_run(result: Any, budget: Budget) -> None:
    assert isinstance(result.final_output, Answer)
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == len(budget.expressions) >= 1
    assert kinds.count("tool_call_output_item") == len(budget.expressions) and kinds[-1] == "message_output_item"
    [first, last] = result.raw_responses
    calls = [o for o in first.output if o.type == "function_call"]
    assert [json.loads(c.arguments)["expression"] for c in calls] == budget.expressions
    assert json.loads(last.output[0].content[0].text) == result.final_output.model_dump()


@pytest.mark.parametrize("streamed", [False, True])
def test_the_agents_sdk_runs_a_tool_loop_on_the_server(embedded_server, streamed):
    check_run(*run_agent(embedded_server.url + "/v1", "none", streamed))


@pytest.mark.parametrize("streamed", [False, True])
def test_the_agents_sdk_through_the_gateway_is_recorded_token_exactly(embedded_server, streamed):
    gw = start_gateway([embedded_server.url], model="tiny", max_model_len=4096)
    headers = {"Authorization": f"Bearer {gw.admin_key}"}
    try:
        info = httpx.post(gw.url + "/sessions", json={}, headers=headers).json()
        result, budget = run_agent(info["base_url"], info["api_key"], streamed)
        check_run(result, budget)
        r = httpx.post(f"{gw.url}/sessions/{info['id']}/finish", json={}, headers=headers)
        trajs = [Trajectory.from_dict(t) for t in r.json()["trajectories"]]
    finally:
        gw.stop()
    # the calculator is gone from the second call's tools, so its prompt renders anew: a branch of its own
    turns = [turn for traj in trajs for turn in traj.turns]
    assert len(turns) == len(result.raw_responses) == 2
    tokenizer = load_tokenizer("tiny")
    first, last = result.raw_responses
    _, parsed, _ = parse_tool_calls(tokenizer.decode(turns[0].response_ids, skip_special_tokens=False))
    got = [(c.name, json.loads(c.arguments)) for c in first.output if c.type == "function_call"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == got
    assert tokenizer.decode(turns[1].response_ids, skip_special_tokens=True) == last.output[0].content[0].text
    for turn, response in zip(turns, result.raw_responses):
        assert len(turn.response_ids) == len(turn.logprobs) == response.usage.output_tokens
        assert len(turn.prompt_ids) == response.usage.input_tokens


def test_the_example_agent_gives_trajectories_to_train_on(embedded_server):
    """examples/agents_sdk_responses.py, as ``agentgym train --agent`` runs it: each session ends with a
    structured answer the GSM8K reward reads, and is recorded as a trajectory that is not failed."""
    from agentgym.gateway.agent_source import AgentTrajectorySource
    from examples.agents_sdk_responses import run

    tasks = [
        {"index": i, "question": f"What is {i} + 2?", "ground_truth": str(i + 2), "reward_fn": "gsm8k"}
        for i in range(2)
    ]
    gw = start_gateway([embedded_server.url], model="tiny", max_model_len=4096)

    async def collect() -> list[Trajectory]:
        # many turns allowed: where the chat path lets the model choose between a tool call and the JSON
        # answer (tool_choice auto with text.format), a random model may call the calculator a few times
        agent = functools.partial(run, max_turns=20)
        source = AgentTrajectorySource(agent, tasks, n=2, gateway=gw, sampling={"max_tokens": 200})
        try:
            return await source.collect(1)
        finally:
            await source.aclose()

    try:
        trajs = asyncio.run(collect())
    finally:
        gw.stop()
    # a random model's reply can run into the token limit (200) before its answer closes: the SDK raises for
    # the incomplete response and the session is finished failed, as the example says; nothing else may fail
    finished = [t for t in trajs if t.status != "failed"]
    cut = [t for t in trajs if t.status == "failed" and "max_output_tokens" in (t.failure or "")]
    assert len(trajs) >= 4 and len(finished) + len(cut) == len(trajs), [t.failure for t in trajs]
    assert len(finished) >= 2, [t.failure for t in trajs]
    for traj in finished:
        assert traj.num_turns >= 1 and traj.outcome_reward in (0.0, 1.0)
        json.loads(load_tokenizer("tiny").decode(traj.turns[-1].response_ids, skip_special_tokens=True))
