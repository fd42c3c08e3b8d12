"""The gateway through the real ``openai`` client: sessions, token-exact recording, branching,
the OpenAI surface, rewards, pause, and trajectories that train like env rollouts.

Most tests run against the stand-in policy server (``tests/support/standin_server.py`` in echo mode, a
child process answering ``/v1/completions`` token-in/token-out, deterministically from the
prompt: ``CALC: x`` gets a calculator tool call, a tool response gets ``#### <result>``, anything
else ``echo: ...``), so the tests can recompute exactly what the server sampled (``oracle``). One
test runs the embedded server with the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from agentgym.gateway.agent_source import AgentTrajectorySource, DataPool, load_agent
from agentgym.gateway.client import GatewayClient
from agentgym.gateway.serve import start_gateway
from agentgym.model import load_tokenizer
from agentgym.types import Trajectory
from tests.support.fidelity import logprob_tolerance
from tests.support.gateway_sessions import admin, client_for, finish, new_session

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def as_message(message) -> dict:
    return message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


def assert_sampled_by_server(traj: Trajectory, oracle) -> None:
    """Every turn's response is exactly what the stand-in samples for the context before it."""
    context: list[int] = []
    for turn in traj.turns:
        context += turn.prompt_ids
        assert turn.response_ids == oracle.reply_ids(context)
        assert turn.logprobs == pytest.approx(oracle.logprobs(turn.response_ids))
        context += turn.response_ids
    assert context == traj.token_ids()


def assert_token_views_consistent(traj: Trajectory) -> None:
    ids, mask, lps, rewards = traj.token_ids(), traj.loss_mask(), traj.token_logprobs(), traj.token_rewards()
    assert len(ids) == len(mask) == len(lps) == len(rewards)
    assert sum(mask) == sum(len(t.response_ids) for t in traj.turns)
    assert [lp for lp, m in zip(lps, mask) if m] == [lp for t in traj.turns for lp in t.logprobs]
    assert sum(rewards) == pytest.approx(traj.total_reward)
    assert Trajectory.from_json(traj.to_json()) == traj


# ---- agents ------------------------------------------------------------------------------------
def test_multi_turn_tool_agent_records_one_token_exact_trajectory(gw, oracle, tok):
    agent = load_agent("examples.gsm8k_agent:run")
    info = new_session(gw, task={"reward_fn": "gsm8k", "ground_truth": "27"}, group_id="g-tools")
    reply = agent(info["base_url"], info["api_key"], {"question": "CALC: 48 / 2 + 3"})
    assert reply == "The tool says 27. #### 27"
    [traj] = finish(gw, info)
    assert traj.group_id == "g-tools" and traj.status == "ok"
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1
    assert traj.outcome_reward == 1.0 and traj.metrics["reward_fn_score"] == 1.0
    call = traj.messages[2]["tool_calls"][0]["function"]
    assert call["name"] == "calculator" and json.loads(call["arguments"]) == {"expression": "48 / 2 + 3"}
    assert traj.messages[3] == {
        "role": "tool",
        "content": "27",
        "tool_call_id": traj.messages[2]["tool_calls"][0]["id"],
    }
    # turn 2 read only the tool result: the closing newline, the tool block and the generation prompt
    assert tok.decode(traj.turns[1].prompt_ids) == (
        "\n<|im_start|>user\n<tool_response>\n27\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert all(t.weight_version == 3 for t in traj.turns)
    assert traj.metrics["template_mismatch"] == 0
    assert_sampled_by_server(traj, oracle)
    assert_token_views_consistent(traj)


def test_resent_history_is_merged_into_one_trajectory(gw, oracle):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "system", "content": "Be brief."}]
    prompts = []
    for k in range(4):
        messages.append({"role": "user", "content": f"turn {k}"})
        response = client.chat.completions.create(model="any", messages=messages, extra_body={"return_token_ids": True})
        prompts.append(response.model_extra["prompt_token_ids"])
        assert response.choices[0].message.content == f"echo: turn {k}"
        messages.append(as_message(response.choices[0].message))
    [traj] = finish(gw, info)
    assert traj.num_turns == 4 and traj.metrics["branches"] == 1
    # what the server saw on each turn is the recorded sequence up to that turn
    ids = traj.token_ids()
    for k, prompt in enumerate(prompts):
        seen = sum(len(t.prompt_ids) + len(t.response_ids) for t in traj.turns[:k]) + len(traj.turns[k].prompt_ids)
        assert prompt == ids[:seen]
    assert_sampled_by_server(traj, oracle)
    assert_token_views_consistent(traj)


def test_edited_history_starts_a_branch_of_its_own(gw, oracle, tok):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "user", "content": "first"}]
    messages.append(as_message(client.chat.completions.create(model="m", messages=messages).choices[0].message))
    messages.append({"role": "user", "content": "second"})
    messages.append(as_message(client.chat.completions.create(model="m", messages=messages).choices[0].message))
    # the agent rewrites its second message (a fork after the first reply) ...
    edited = messages[:2] + [{"role": "user", "content": "second, edited"}]
    assert (
        client.chat.completions.create(model="m", messages=edited).choices[0].message.content == "echo: second, edited"
    )
    # ... and edits the model's first reply (nothing of the recorded tokens can be reused)
    forged = [messages[0], {"role": "assistant", "content": "something else"}, {"role": "user", "content": "third"}]
    client.chat.completions.create(model="m", messages=forged)
    # the original line goes on: an exact extension of the first branch
    messages.append({"role": "user", "content": "fourth"})
    client.chat.completions.create(model="m", messages=messages)

    main, fork, fresh = finish(gw, info)
    assert [t.metrics["branches"] for t in (main, fork, fresh)] == [3, 3, 3]
    assert main.num_turns == 3 and main.metrics["active_branch"] == 1
    assert main.task["parent"] is None and fork.task["parent"] == [0, 2] and fresh.task["parent"] is None
    # the fork reads the first exchange exactly as sampled (mask 0) and trains only on its own reply
    [turn] = fork.turns
    shared = len(main.turns[0].prompt_ids) + len(main.turns[0].response_ids)
    assert turn.prompt_ids[:shared] == main.token_ids()[:shared]
    assert fork.loss_mask().count(1) == len(turn.response_ids)
    assert tok.decode(turn.prompt_ids[shared:]).startswith("\n<|im_start|>user\nsecond, edited")
    # the forged reply is rendered from its text, as context
    assert "something else" in tok.decode(fresh.turns[0].prompt_ids)
    for traj in (main, fork, fresh):
        assert_sampled_by_server(traj, oracle)
        assert_token_views_consistent(traj)
    stats = httpx.get(gw.url + "/stats").json()
    assert stats["fork"] >= 1 and stats["fresh"] >= 2


def test_n_samples_are_separate_branches_and_the_chosen_one_continues(gw, oracle):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "user", "content": "pick one"}]
    response = client.chat.completions.create(model="m", messages=messages, n=3)
    assert [c.index for c in response.choices] == [0, 1, 2]
    messages += [as_message(response.choices[1].message), {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="m", messages=messages)
    trajs = finish(gw, info)
    assert len(trajs) == 3 and {t.metrics["branches"] for t in trajs} == {3}
    assert sorted(t.num_turns for t in trajs) == [1, 1, 2]
    for traj in trajs:
        assert_sampled_by_server(traj, oracle)


def test_streaming_matches_the_plain_response(gw):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "user", "content": "CALC: 6 * 7"}]
    stream = client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}, logprobs=True
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == "" and finishes == ["tool_calls"]
    assert calls[0].function.name == "calculator" and json.loads(calls[0].function.arguments) == {"expression": "6 * 7"}
    assert chunks[-1].usage.completion_tokens > 0
    # the streamed reply is the recorded one: re-sending it extends the same branch
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "calculator", "arguments": calls[0].function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": "42"},
    ]
    final = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert final.choices[0].message.content == "The tool says 42. #### 42"
    [traj] = finish(gw, info)
    assert traj.num_turns == 2


async def test_async_client_streaming_and_text_completions(gw, oracle):
    info = new_session(gw)
    async with openai.AsyncOpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "echo: hi"
        first = await client.completions.create(model="m", prompt="<|im_start|>user\nabc<|im_end|>\n", max_tokens=50)
        prompt = "<|im_start|>user\nabc<|im_end|>\n" + first.choices[0].text + "<|im_start|>user\nxyz<|im_end|>\n"
        second = await client.completions.create(model="m", prompt=prompt, max_tokens=50, logprobs=1)
        assert second.choices[0].text == "echo: xyz"
        lp = second.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs)
        assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(len(lp.tokens))]
        stream = await client.completions.create(model="m", prompt="<|im_start|>user\nnew<|im_end|>\n", stream=True)
        assert "".join([c.choices[0].text async for c in stream if c.choices]) == "echo: new"
        models = await client.models.list()
        assert models.data[0].id == "tiny"
    chat, text_branch, streamed = finish(gw, info)
    assert chat.num_turns == 1 and text_branch.num_turns == 2  # the text prompt extended its branch
    assert streamed.num_turns == 1
    assert_sampled_by_server(text_branch, oracle)


# ---- sampling, keys, errors -----------------------------------------------------------------------
def test_pinned_sampling_overrides_the_agent_and_stop_strings_cut(gw):
    info = new_session(gw, sampling={"max_tokens": 3})
    client = client_for(info)
    response = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "a long message"}], max_tokens=100, logprobs=True
    )
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3
    assert len(response.choices[0].logprobs.content) == 3
    [traj] = finish(gw, info)
    assert traj.status == "truncated" and len(traj.turns[0].response_ids) == 3

    info = new_session(gw)
    response = client_for(info).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "abc STOP def"}], stop=["STOP"]
    )
    assert response.choices[0].message.content == "echo: abc "
    assert "STOP" in finish(gw, info)[0].turns[0].response_text  # the model's context keeps what it sampled


def test_keys_are_per_session_and_errors_have_openai_shape(gw):
    a, b = new_session(gw), new_session(gw)
    messages = [{"role": "user", "content": "hi"}]
    wrong = openai.OpenAI(base_url=a["base_url"], api_key=b["api_key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as err:
        wrong.chat.completions.create(model="m", messages=messages)
    assert err.value.body["code"] == "wrong_session"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=a["base_url"], api_key="sk-nope", max_retries=0).chat.completions.create(
            model="m", messages=messages
        )
    gone = {**a, "base_url": a["base_url"].replace(a["id"], "nope")}
    with pytest.raises(openai.NotFoundError):
        client_for(gone).chat.completions.create(model="m", messages=messages)
    r = httpx.post(
        a["base_url"] + "/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {a['api_key']}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as err:
        client_for(a).chat.completions.create(model="m", messages=[{"role": "user", "content": "x " * 3000}])
    assert err.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client_for(a).chat.completions.create(model="m", messages=[{"role": "wizard", "content": "hi"}])
    assert (
        httpx.get(f"{gw.url}/sessions/{a['id']}", headers={"Authorization": f"Bearer {b['api_key']}"}).status_code
        == 403
    )
    # a finished session takes no more calls; finishing again returns the same trajectories
    client_for(a).chat.completions.create(model="m", messages=messages)
    first = finish(gw, a)
    assert finish(gw, a) == first
    with pytest.raises(openai.ConflictError):
        client_for(a).chat.completions.create(model="m", messages=messages)
    r = httpx.post(gw.url + "/sessions", json={"task": {"reward_fn": "gsm8kk", "ground_truth": "1"}}, headers=admin(gw))
    assert r.status_code == 400 and "Did you mean 'gsm8k'" in r.json()["error"]["message"]
    assert httpx.get(gw.url + "/health").json()["status"] == "ok"


def test_admin_key_guards_admin_endpoints(standin):
    with start_gateway([standin], model="tiny", admin_key="sk-admin") as handle:
        assert httpx.post(handle.url + "/sessions", json={}).status_code == 401
        info = httpx.post(handle.url + "/sessions", json={}, headers={"Authorization": "Bearer sk-admin"}).json()
        assert httpx.get(f"{handle.url}/sessions/{info['id']}").status_code == 401
        assert (
            httpx.get(
                f"{handle.url}/sessions/{info['id']}", headers={"Authorization": f"Bearer {info['api_key']}"}
            ).status_code
            == 200
        )
        assert httpx.post(handle.url + "/pause", json={}).status_code == 401


def test_rewards_posted_and_computed_are_summed(gw):
    info = new_session(gw, task={"reward_fn": "gsm8k", "ground_truth": "5"})
    client = client_for(info)
    messages = [{"role": "user", "content": "CALC: 2 + 3"}]
    r1 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = r1.choices[0].message.tool_calls[0]
    auth = {"Authorization": f"Bearer {info['api_key']}"}  # the agent posts with its own key
    assert (
        httpx.post(
            f"{gw.url}/sessions/{info['id']}/reward", json={"reward": 0.1, "kind": "turn"}, headers=auth
        ).status_code
        == 200
    )
    messages += [as_message(r1.choices[0].message), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert httpx.post(f"{gw.url}/sessions/{info['id']}/reward", json={"reward": 0.5}, headers=auth).status_code == 200
    bad = httpx.post(f"{gw.url}/sessions/{info['id']}/reward", json={"reward": "lots"}, headers=auth)
    assert bad.status_code == 400
    [traj] = finish(gw, info)
    assert traj.turns[0].reward == pytest.approx(0.1)
    assert traj.outcome_reward == pytest.approx(1.5)  # posted 0.5 + gsm8k 1.0
    assert traj.total_reward == pytest.approx(1.6) and sum(traj.token_rewards()) == pytest.approx(1.6)
    summary = httpx.get(f"{gw.url}/sessions/{info['id']}", headers=admin(gw)).json()
    assert summary["finished"] and summary["branches"][0]["num_turns"] == 2


def test_training_and_eval_agree_on_a_gateway_trajectorys_success(gw):
    """One rule (``Trajectory.success``) behind training's success_rate, ``agentgym eval``'s table,
    the held-out score and dynamic sampling's ``acc``, for gateway trajectories too."""
    from agentgym.rollout.metrics import summarize
    from agentgym.tracking import trajectory_metrics
    from agentgym.trainer.dynamic_sampling import episode_score

    def run(**finish_body) -> Trajectory:
        info = new_session(gw)
        client_for(info).chat.completions.create(model="m", messages=[{"role": "user", "content": "CALC: 1 + 1"}])
        [traj] = finish(gw, info, **finish_body)
        return traj

    solved, unsolved, crashed = run(reward=1.0), run(reward=0.0), run(reward=1.0, failure="the agent crashed")
    assert crashed.status == "failed" and crashed.outcome_reward == 1.0  # a reward does not make a failure a success
    # the same solved episode saved without its success metric (an older file, a hand-built trajectory)
    unmarked = Trajectory.from_dict({**solved.to_dict(), "metrics": {}})
    trajectories = [solved, unsolved, crashed, unmarked]
    assert [t.success for t in trajectories] == [True, False, False, True]
    assert [episode_score(t, "acc", 1.0, 1.0) for t in trajectories] == [1.0, 0.0, 0.0, 1.0]
    assert trajectory_metrics(trajectories)["success_rate"] == summarize(trajectories)["success_rate"] == 0.5


def test_pause_holds_calls_until_resume(gw):
    info = new_session(gw)
    client = client_for(info)
    assert httpx.post(gw.url + "/pause", json={}, headers=admin(gw)).json()["paused"] is True
    done = threading.Event()

    def call() -> None:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "wait"}])
        done.set()

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert not done.wait(0.5)
    finally:
        httpx.post(gw.url + "/resume", headers=admin(gw))
    assert done.wait(10)
    thread.join()
    assert finish(gw, info)[0].num_turns == 1


def test_a_call_that_outlives_its_session_is_refused_and_not_recorded(gw):
    info = new_session(gw)
    client = client_for(info)
    httpx.post(gw.url + "/pause", json={}, headers=admin(gw))
    errors = []

    def call() -> None:
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
        except openai.APIStatusError as exc:
            errors.append(exc.status_code)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)
    assert finish(gw, info) == []  # finished while the call waits for the pause to end
    httpx.post(gw.url + "/resume", headers=admin(gw))
    thread.join(10)
    assert errors == [409] and finish(gw, info) == []


def test_a_new_tool_list_starts_a_fresh_branch(gw, tok):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "user", "content": "hi"}]
    messages += [
        as_message(client.chat.completions.create(model="m", messages=messages).choices[0].message),
        {"role": "user", "content": "again"},
    ]
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # the system prompt changed
    first, second = finish(gw, info)
    assert first.num_turns == 1 and second.num_turns == 1 and second.task["parent"] is None
    assert "<tools>" not in tok.decode(first.token_ids()) and "<tools>" in tok.decode(second.turns[0].prompt_ids)


def test_idle_sessions_expire_as_failed(tok):
    from agentgym.gateway.sessions import SessionStore
    from agentgym.rollout.chat import ChatTokenizer

    store = SessionStore(ChatTokenizer(tok), idle_timeout=0.0)
    session = store.create()
    assert store.expire() == 1 and session.finished and "expired" in session.failure
    assert store.get(session.id) is session and not store.open


async def test_gateway_client_weight_update_context(gw):
    client = GatewayClient(gw.url, gw.admin_key)
    try:
        async with client.weight_update(7):
            assert (await client.stats())["paused"] is True
        assert (await client.stats())["paused"] is False
    finally:
        await client.aclose()
    # servers that report no version with their samples (vLLM, SGLang) are taken to hold version 7 now
    assert {s.version for s in gw.gateway.policy.servers} == {7}
    assert httpx.post(gw.url + "/resume", json={"weight_version": "seven"}, headers=admin(gw)).status_code == 400


# ---- training from agents ------------------------------------------------------------------------
def test_data_pool_completes_groups_when_every_session_finished():
    pool = DataPool()
    pool.open_group("g", 2)
    t = Trajectory(group_id="g")
    pool.add("g", [t])
    assert not pool.complete("g") and pool.pop_complete() == []
    pool.add("g", [t, t])
    assert pool.complete("g") and pool.pop_complete() == [[t, t, t]]
    with pytest.raises(KeyError):
        pool.add("g", [t])


async def test_agent_source_runs_sync_and_async_agents_in_groups(gw, oracle):
    tasks = [
        {"index": i, "question": f"CALC: {i} * 10", "ground_truth": str(i * 10), "reward_fn": "gsm8k"} for i in range(3)
    ]
    source = AgentTrajectorySource(
        "examples.gsm8k_agent:run",
        tasks,
        n=2,
        gateway=gw,
        tasks_per_step=2,
        sampling={"temperature": 0.7},
        concurrency=4,
    )
    try:
        trajs = await source.collect(step=1)
        assert len(trajs) == 4 and len({t.group_id for t in trajs}) == 2
        assert all(t.outcome_reward == 1.0 and t.num_turns == 2 for t in trajs)
        assert source.last_metrics["success_rate"] == 1.0 and source.last_metrics["agent/failed_sessions"] == 0
        questions = {t.messages[1]["content"] for t in trajs}
        assert len(questions) == 2
        epoch = source.tasks_for_step(1) + source.tasks_for_step(2)[:1]  # steps walk a shuffled epoch
        assert sorted(t["index"] for t in epoch) == [0, 1, 2]
    finally:
        await source.aclose()

    seen_tasks = []

    async def agent(base_url: str, api_key: str, task: dict) -> float:
        seen_tasks.append(task)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
        if task["index"] == 1:
            raise RuntimeError("the agent fell over")
        return 0.25

    source = AgentTrajectorySource(agent, tasks[:2], n=3, gateway=gw.url, admin_key=gw.admin_key)
    try:
        trajs = await source.collect(step=1)
    finally:
        await source.aclose()
    assert all("ground_truth" not in t for t in seen_tasks)  # the agent never sees the answer
    by_status = {t.status for t in trajs if t.task["index"] == 1}, {t.status for t in trajs if t.task["index"] == 0}
    assert by_status == ({"failed"}, {"ok"})
    assert all(t.outcome_reward == 0.25 for t in trajs if t.status == "ok")
    assert "the agent fell over" in next(t.failure for t in trajs if t.status == "failed")


def test_agent_trajectories_build_the_same_training_batch_as_env_rollouts(gw):
    from agentgym.trainer.batch import build_batch

    tasks = [
        {"index": i, "question": f"CALC: {i} + {i}", "ground_truth": str(2 * i), "reward_fn": "gsm8k"} for i in range(2)
    ]

    async def collect() -> list[Trajectory]:
        source = AgentTrajectorySource("examples.gsm8k_agent:run", tasks, n=2, gateway=gw)
        try:
            return await source.collect(1)
        finally:
            await source.aclose()

    trajs = asyncio.run(collect())
    batch, skipped = build_batch(trajs, pad_token_id=0)
    assert len(batch) == 4 and not any(skipped.values())
    for row, traj in enumerate(trajs):
        assert_token_views_consistent(traj)
        start = int(batch["prompt_lengths"][row])
        n = len(traj.token_ids()) - start
        assert batch["response_mask"][row, :n].tolist() == traj.loss_mask()[start:]
        assert batch["token_level_scores"][row].sum().item() == pytest.approx(traj.total_reward)


# ---- the embedded server with the tiny model -------------------------------------------------------
def test_gateway_over_the_embedded_tiny_model_records_what_it_sampled(embedded_server):
    from agentgym.client import PolicyClient
    from agentgym.types import SamplingParams

    server = embedded_server
    with start_gateway([server.url], model="tiny") as handle:
        info = new_session(handle, sampling={"temperature": 0.0, "max_tokens": 12})
        client = client_for(info)
        messages = [{"role": "user", "content": "What is 48 / 2?"}]
        for follow_up in ("And then?", "Thanks."):
            response = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, logprobs=True)
            messages += [as_message(response.choices[0].message), {"role": "user", "content": follow_up}]
        [traj] = finish(handle, info)
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1

    async def direct() -> list:
        async with PolicyClient(server.url) as policy:
            context, out = [], []
            for turn in traj.turns:
                context += turn.prompt_ids
                out.append(await policy.generate(context, SamplingParams(temperature=0.0, max_tokens=12)))
                context += turn.response_ids
            return out

    for turn, sample in zip(traj.turns, asyncio.run(direct())):
        assert turn.response_ids == sample.token_ids  # greedy: the same context samples the same ids
        assert turn.logprobs == pytest.approx(sample.logprobs, abs=logprob_tolerance(server.engine.model.dtype))
        assert turn.weight_version == sample.weight_version
    assert_token_views_consistent(traj)


def test_stats_count_what_happened(gw):
    info = new_session(gw)
    client_for(info).chat.completions.create(model="m", messages=[{"role": "user", "content": "count me"}])
    finish(gw, info)
    stats = httpx.get(gw.url + "/stats").json()
    assert stats["sessions"] >= stats["finished"] > 0 and stats["completions"] > 0
    assert stats["inflight"] == 0 and not stats["paused"]


def test_trajectory_source_from_the_training_config(standin, tmp_path):
    """What ``agentgym train --agent`` builds: tasks from data files, pinned sampling, groups of n."""
    from agentgym.gateway.agent_source import trajectory_source
    from agentgym.trainer.config import load_config

    rows = [{"question": f"CALC: {i} * 3", "answer": f"so #### {3 * i}"} for i in range(4)]
    rows.append(
        {
            "prompt": [{"role": "user", "content": "CALC: 10 - 1"}],
            "data_source": "openai/gsm8k",
            "reward_model": {"ground_truth": "9"},
        }
    )
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = load_config(
        overrides=[
            f"data.train_files={path}",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "data.val_batch_size=1",
            "actor_rollout_ref.rollout.temperature=0.5",
        ],
        agent="examples.gsm8k_agent:run",
    )

    class Servers:  # what the trainer passes: RolloutServers' urls, backend and client
        urls, backend = [standin], "embedded"
        client = type("Client", (), {"model": None})()

    source = trajectory_source(cfg, "examples.gsm8k_agent:run", Servers())

    async def go() -> tuple[list[Trajectory], list[Trajectory]]:
        try:
            return await source.collect(1), await source.validate()
        finally:
            await source.aclose()

    trajs, val = asyncio.run(go())
    assert source.steps_per_epoch == 2
    assert len(trajs) == 4 and len({t.group_id for t in trajs}) == 2
    assert all(t.outcome_reward == 1.0 and t.data_source == "openai/gsm8k" for t in trajs)
    assert len(val) == 1 and val[0].outcome_reward == 1.0


def test_logprob_bytes_are_the_tokens_own_bytes(gw):
    """Byte-level BPE splits a multi-byte character over tokens; each token's ``bytes`` are its raw
    bytes (not the UTF-8 of a replacement character), so together they spell the reply."""
    text = "héllo ✓ 日本"
    response = client_for(new_session(gw)).chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], logprobs=True
    )
    content = response.choices[0].logprobs.content
    assert response.choices[0].message.content == f"echo: {text}"
    spelled = b"".join(bytes(c.bytes) for c in content).decode()
    assert spelled.removesuffix("<|im_end|>") == f"echo: {text}"


def test_reward_fns_live_in_the_one_registry():
    import agentgym
    from agentgym.gateway.rewards import gsm8k_reward, resolve_reward_fn

    def length(messages, task) -> float:
        return float(len(messages))

    assert resolve_reward_fn("gsm8k") is gsm8k_reward  # the built-in arrives as an agentgym.reward_fns entry point
    agentgym.register("test_length", length, kind="reward_fn")
    assert {"gsm8k", "test_length"} <= set(agentgym.registered("reward_fn"))
    assert resolve_reward_fn("test_length") is length
    with pytest.raises(ValueError, match="Did you mean 'test_length'"):
        resolve_reward_fn("test_lenght")


def test_bad_agent_and_reward_fn_names_say_what_is_wrong():
    from agentgym.gateway.rewards import resolve_reward_fn

    with pytest.raises(ValueError, match="package.module:function"):
        load_agent("examples.gsm8k_agent")
    with pytest.raises(ValueError, match="could not import the agent module 'no_such_agent_module'"):
        load_agent("no_such_agent_module:run")
    with pytest.raises(ValueError, match="has no 'missing'"):
        load_agent("examples.gsm8k_agent:missing")
    with pytest.raises(ValueError, match="not callable"):
        load_agent("examples.gsm8k_agent:__doc__")
    with pytest.raises(ValueError, match="could not be imported"):
        resolve_reward_fn("os.path:no_such_fn", allowed=["os.path:*"])
    with pytest.raises(ValueError, match="Did you mean 'gsm8k'"):
        resolve_reward_fn("gsm8kk")
    with pytest.raises(ValueError, match="not allowed"):  # import paths only from the operator's allowlist
        resolve_reward_fn("os.path:basename")
    assert resolve_reward_fn("os.path:basename", allowed=["os.path:basename"]) is __import__("os").path.basename
