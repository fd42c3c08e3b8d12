"""What a black-box agent run takes as its reward, and a gateway 401 read as what it is: the agent did not
send the key it was given."""

from __future__ import annotations

import logging

import openai
import pytest

from agentgym.gateway.agent_source import AgentTrajectorySource, agent_failure
from agentgym.trainer.step_checks import TrainingFailed, failed_episode_check

TASKS = [{"index": 0, "question": "CALC: 2 * 10", "ground_truth": "20"}]  # no reward_fn, no data_source


async def run(gw, agent, tasks=TASKS, n=2):
    source = AgentTrajectorySource(agent, tasks, n=n, gateway=gw.url, admin_key=gw.admin_key)
    try:
        return await source.collect(step=1)
    finally:
        await source.aclose()


async def ask(base_url: str, api_key: str, task: dict) -> None:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])


async def test_a_float_return_is_the_reward_and_a_turn_count_is_not(gw, caplog):
    async def returns_float(base_url, api_key, task):
        await ask(base_url, api_key, task)
        return 0.75

    async def returns_turns(base_url, api_key, task):
        await ask(base_url, api_key, task)
        return 1  # a count of turns, as agents often return

    with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
        assert {t.outcome_reward for t in await run(gw, returns_float)} == {0.75}
        assert {t.outcome_reward for t in await run(gw, returns_turns)} == {0.0}
    assert "rewarded by" in caplog.text and "plus the agent's return value when it is a float" in caplog.text
    assert "returned 1 (int): not taken as its reward" in caplog.text
    assert caplog.text.count("returned 1 (int)") == 1  # once, not per session


async def test_no_reward_from_anywhere_is_warned(gw, caplog):
    async def returns_nothing(base_url, api_key, task):
        await ask(base_url, api_key, task)

    with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
        await run(gw, returns_nothing)
    assert "names no reward_fn: the session's reward is 0" in caplog.text


async def test_a_gateway_401_stops_the_run_as_an_auth_failure(gw):
    async def own_key(base_url, api_key, task):
        await ask(base_url, "sk-my-own-openai-key", task)

    trajectories = await run(gw, own_key)
    assert len(trajectories) == 2 and all(t.status == "failed" for t in trajectories)  # not an empty step
    with pytest.raises(TrainingFailed, match="refused the agent's API key.*api_key it is given"):
        failed_episode_check(trajectories, step=1, max_frac=0.5)


def test_agent_failure_reads_status_codes():
    class Refused(Exception):
        status_code = 401

    assert "api_key it is given" in agent_failure(Refused("nope"))
    assert agent_failure(ValueError("x")) == "the agent raised ValueError: x"
