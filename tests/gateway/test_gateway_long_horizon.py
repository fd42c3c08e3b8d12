"""An agent that drops its old turns (a history window) through the gateway: its session's chain of
branches is one episode (agentgym/gateway/episodes.py), trained as per-turn samples, each exactly what
the stand-in server was sent and sampled, with no template mismatch and no turn left out."""

from __future__ import annotations

import openai
import pytest

from agentgym.gateway.agent_source import AgentTrajectorySource
from agentgym.gateway.episodes import is_chain
from agentgym.trainer.batch import build_batch
from agentgym.types import Trajectory

TURNS = 5
WINDOW = 1  # exchanges the agent keeps after its task


async def windowed_agent(base_url: str, api_key: str, task: dict) -> float:
    """Keeps the system and task messages and only its last exchange, like a context-limited agent."""
    head = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task["question"]}]
    exchanges: list[list[dict]] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        for k in range(TURNS):
            messages = head + [m for pair in exchanges[-WINDOW:] for m in pair]
            reply = (await client.chat.completions.create(model="m", messages=messages)).choices[0].message
            exchanges.append([{"role": "assistant", "content": reply.content}, {"role": "user", "content": f"obs {k}"}])
    return 1.0


async def collect(gw, branches: str) -> list[Trajectory]:
    tasks = [{"index": i, "question": f"task {i}"} for i in range(2)]
    source = AgentTrajectorySource(windowed_agent, tasks, n=2, gateway=gw, tasks_per_step=2, branches=branches)
    try:
        return await source.collect(1)
    finally:
        await source.aclose()


async def test_an_agent_that_drops_old_turns_trains_through_per_turn_samples(gw, oracle):
    trajs = await collect(gw, "episode")
    assert len(trajs) == 4  # one episode per session, not one per branch
    for traj in trajs:
        assert traj.num_turns == TURNS and traj.outcome_reward == 1.0 and traj.status == "ok"
        assert traj.metrics["joined_branches"] > 1 and traj.metrics["template_mismatch"] == 0.0
        assert not traj.single_sequence  # later turns start a context of their own
        for k, turn in enumerate(traj.turns):
            context = traj.turn_context(k)
            assert turn.response_ids == oracle.reply_ids(context)  # what the server sampled for what it was sent
            assert turn.logprobs == pytest.approx(oracle.logprobs(turn.response_ids))
            text = oracle.tok.decode(context)
            assert all(f"obs {j}<" not in text for j in range(k - WINDOW))  # the dropped turns are not there
    batch, skipped = build_batch(trajs, pad_token_id=0)
    assert not skipped and batch.episodes is not None
    trained = batch["response_mask"].sum().item()
    assert trained == sum(len(t.response_ids) for traj in trajs for t in traj.turns)  # no turn lost
    scores = batch.episodes.gather(batch["episode_position"], batch["token_level_scores"]).sum(-1)
    assert scores.tolist() == [1.0] * 4  # the outcome once per episode, on its last turn


async def test_without_joining_each_branch_is_a_trajectory(gw):
    trajs = await collect(gw, "all")
    sessions: dict[str, list[Trajectory]] = {}
    for t in trajs:
        sessions.setdefault(t.task["session_id"], []).append(t)
    assert len(sessions) == 4 and all(len(b) > 1 and is_chain(b) for b in sessions.values())
    # the posted reward reaches only the branch the agent ended on: why the chain is joined by default
    assert sorted(t.outcome_reward for t in trajs)[0] == 0.0
