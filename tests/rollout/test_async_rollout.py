"""The rollout side of asynchronous training: partial rollout (a generation aborted by a weight push
continues on the new weights, every token stamped with its version), seeded requests, the DataPool,
and a gateway feeding a DataPool."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from agentgym.client import PolicyClient
from agentgym.envs.base import TextEnv
from agentgym.model import load_tokenizer
from agentgym.rollout import RolloutConfig, RolloutRunner, Task
from agentgym.rollout.data_pool import DataPool, PoolClient
from agentgym.types import Trajectory, Turn

TOK = load_tokenizer("tiny")


class TalkEnv(TextEnv):
    """One turn: anything the model says ends it."""

    max_turns = 1

    def reset(self, seed=None, options=None):
        return [{"role": "user", "content": f"Tell me a long story number {seed}."}], {}

    def step(self, action):
        return [], 0.0, True, False, {"outcome_reward": 0.0}


def _teacher_forced(model, prompt: list[int], response: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [float(logprobs[len(prompt) + i - 1, t]) for i, t in enumerate(response)]


async def test_partial_rollout_continues_aborted_generations_on_the_new_weights():
    from agentgym.model import load_causal_lm
    from agentgym.server.launch import start_embedded_server

    server = start_embedded_server("tiny", max_batch_size=8)
    engine = server.engine
    old = {k: v.clone() for k, v in engine.model.state_dict().items()}
    torch.manual_seed(0)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in old.items()}
    config = RolloutConfig(n=4, max_tokens=64, partial_rollout=True, env_executor="inline", template_check_every=0)
    try:
        async with PolicyClient(server.url) as client:
            runner = RolloutRunner(TalkEnv, client, "tiny", config)
            job = asyncio.ensure_future(runner.run([Task(seed=1), Task(seed=2)]))
            while engine.stats["generated_tokens"] < 40:  # mid-generation: abort, load, resume
                await asyncio.sleep(0.002)
            await asyncio.wrap_future(engine.pause("abort"))
            await asyncio.wrap_future(engine.update_weights(new, 7))
            engine.resume()
            result = await job
            await runner.aclose()
    finally:
        server.stop()
    spanning = [t for t in result.trajectories if set(t.turns[0].versions()) == {0, 7}]
    assert spanning, [t.turns[0].versions() for t in result.trajectories]
    before, after = load_causal_lm("tiny"), load_causal_lm("tiny")
    before.load_state_dict(old)
    after.load_state_dict(new)
    for traj in spanning:
        turn = traj.turns[0]
        versions = turn.versions()
        assert versions == sorted(versions) and turn.weight_version == 0 and traj.oldest_version() == 0
        assert traj.metrics["resumed_generations"] >= 1 and len(turn.response_ids) <= 64
        cut = versions.index(7)
        lp_old = _teacher_forced(before, turn.prompt_ids, turn.response_ids)
        lp_new = _teacher_forced(after, turn.prompt_ids, turn.response_ids)
        # each token's logprob is that of the weights that sampled it
        assert turn.logprobs[:cut] == pytest.approx(lp_old[:cut], abs=1e-4)
        assert turn.logprobs[cut:] == pytest.approx(lp_new[cut:], abs=1e-4)


def _aborting_policy(request):
    """First request: 3 tokens, aborted; then the rest of the reply."""
    reply = TOK.encode("one two three four<|im_end|>", add_special_tokens=False)
    _aborting_policy.calls += 1
    if _aborting_policy.calls == 1:
        return reply[:3], [-0.5] * 3, "abort"
    have = len(request["prompt"]) - _aborting_policy.prompt_len
    rest = reply[have:][: request["max_tokens"]]
    return rest, [-0.25] * len(rest), "stop"


@pytest.mark.parametrize("partial", [False, True])
async def test_an_abort_ends_the_turn_unless_partial_rollout_continues_it(standin_server, partial):
    _aborting_policy.calls = 0
    standin_server.policy = _aborting_policy
    config = RolloutConfig(n=1, max_tokens=12, partial_rollout=partial, env_executor="inline")
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(TalkEnv, client, "tiny", config)
        _aborting_policy.prompt_len = len(runner.chat.prompt_ids(TalkEnv().reset(seed=3)[0], None))
        result = await runner.run([Task(seed=3)])
        await runner.aclose()
    turn = result.trajectories[0].turns[0]
    reply = TOK.encode("one two three four<|im_end|>", add_special_tokens=False)
    if not partial:  # the synchronous path is unchanged: the abort is where the turn ends
        assert turn.response_ids == reply[:3] and turn.finish_reason == "abort"
        return
    first, second = standin_server.requests
    assert second["request"]["prompt"] == first["request"]["prompt"] + reply[:3]  # continued, not restarted
    assert second["request"]["max_tokens"] == 12 - 3
    assert turn.response_ids == reply and turn.finish_reason == "stop"
    assert turn.logprobs == [-0.5] * 3 + [-0.25] * (len(reply) - 3)
    assert turn.token_versions == []  # one version throughout (the stand-in's): no per-token list needed


async def test_sampling_seed_makes_requests_reproducible(standin_server):
    standin_server.policy = lambda r: (TOK.encode("ok<|im_end|>", add_special_tokens=False), [-0.1, -0.1], "stop")
    seeds = []
    for _ in range(2):
        standin_server.requests.clear()
        config = RolloutConfig(n=2, sampling_seed=5, env_executor="inline")
        async with PolicyClient(standin_server.url) as client:
            runner = RolloutRunner(TalkEnv, client, "tiny", config)
            await runner.run([Task(seed=1), Task(seed=2)])
            await runner.aclose()
        seeds.append(sorted(r["request"]["seed"] for r in standin_server.requests))
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 4  # the same per episode, different across episodes


# ---- the DataPool ------------------------------------------------------------------------------------------


def _traj(group: str, versions: list[int]) -> Trajectory:
    turn = Turn(
        prompt_ids=[1],
        response_ids=[2] * len(versions),
        logprobs=[0.0] * len(versions),
        weight_version=versions[0],
        token_versions=versions,
    )
    return Trajectory(turns=[turn], group_id=group)


async def test_data_pool_groups_order_bound_and_checkpoint():
    pool = DataPool(max_queue_size=2, group_size=2)
    pool.open_group("a", 1, ticket=0, version=0, task={"seed": 0})
    pool.add("b", [_traj("b", [0, 0])])  # never announced: opened with group_size 2
    assert pool.pending() == ["a", "b"] and not pool.full()
    pool.add("b", [_traj("b", [0, 4])])
    pool.add("a", [_traj("a", [0])])
    assert pool.ready() == ["b", "a"] and pool.full()  # completion order; 2 complete groups = full
    state = json.loads(json.dumps(pool.state_dict()))
    client = PoolClient(DataPool())
    await client.load_state_dict(state)
    ((info, trajs),) = await client.take(["a"])
    assert info["ticket"] == 0 and info["task"] == {"seed": 0}
    ((_, trajs),) = await client.take(["b"])
    assert [t.sampled_versions() for t in trajs] == [[0, 0], [0, 4]] and trajs[1].oldest_version() == 0
    assert (await client.stats())["ready"] == 0.0
    with pytest.raises(ValueError, match="one version per response token"):
        Turn(prompt_ids=[], response_ids=[1, 2], logprobs=[0.0, 0.0], token_versions=[1])


async def test_a_gateway_feed_delivers_each_finished_session_once():
    from agentgym.gateway.pool_feed import PoolFeed

    class Pool:
        def __init__(self):
            self.pool = DataPool(group_size=2)

            class Add:
                @staticmethod
                async def remote(group_id, trajectories):
                    self.pool.add(group_id, trajectories)

            self.add = Add()

    async def app(scope, receive, send):  # the gateway's finish route, answering every time
        body = json.dumps({"id": "s1", "group_id": "g", "trajectories": [_traj("g", [3]).to_dict()]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    pool = Pool()
    feed = PoolFeed(app, pool)
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/sessions/s1/finish"}
    await feed(scope, None, send)
    await feed(scope, None, send)  # finishing again answers again but delivers nothing new
    await feed({**scope, "path": "/sessions/s2/finish"}, None, send)
    assert pool.pool.complete("g") and len(pool.pool.pop("g")) == 2
    assert [m["type"] for m in sent].count("http.response.body") == 3  # every caller got its answer


def test_partial_rollout_pauses_servers_known_by_url_through_their_engines_routes(monkeypatch):
    """vLLM: /pause?mode=abort and /resume (checked against a real vLLM in tests/server/test_vllm_real.py);
    SGLang and agentgym's server: /pause_generation {"mode": "abort"} and /continue_generation."""
    from agentgym.client.weights import _Weights
    from agentgym.trainer.rollout_servers import RolloutServers

    calls = []

    def post(self, url, path, json=None, params=None, **_):
        calls.append((url, path, json, params))
        return {}

    monkeypatch.setattr(_Weights, "_post", post)
    for backend in ("vllm", "sglang", "embedded"):
        servers = object.__new__(RolloutServers)  # two servers someone else runs
        servers.handles, servers.urls, servers.backend, servers.admin_key = [], ["http://a", "http://b"], backend, None
        asyncio.run(servers.pause_abort())
        asyncio.run(servers.resume())
    vllm = [(u, "/pause", None, {"mode": "abort"}) for u in "ab"] + [(u, "/resume", None, None) for u in "ab"]
    other = [(u, "/pause_generation", {"mode": "abort"}, None) for u in "ab"] + [
        (u, "/continue_generation", {}, None) for u in "ab"
    ]
    assert calls == [(f"http://{u}", p, j, q) for u, p, j, q in vllm + other + other]
