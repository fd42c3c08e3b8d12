"""Live streaming through the gateway, and policy servers added and removed while it runs.

The stand-in policy server runs in a thread of this process (``StandinServer``, the echo policy),
streaming a token every ``TOKEN_MS`` when asked to stream, so a test can tell tokens sent as they are
sampled from a reply sent once it is complete. What the gateway records must be token for token what
the stand-in sampled, streamed or not.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from agentgym.gateway import start_gateway
from agentgym.types import Trajectory
from tests.support import standin_server
from tests.support.gateway_sessions import admin, client_for, finish, new_session

TOKEN_MS = 60
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
def slow():
    """A stand-in that streams a token every TOKEN_MS."""
    mod = standin_server
    server = mod.StandinServer(policy=mod.BuiltinPolicy("echo"), token_delay_ms=TOKEN_MS, weight_version=5)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(slow):
    with start_gateway([slow.url], model="tiny", health_check_interval=0) as handle:
        yield handle


def test_tokens_reach_the_agent_as_they_are_sampled_and_are_recorded_exactly(gw, oracle):
    info = new_session(gw)
    client = client_for(info)
    start = time.perf_counter()
    arrivals, pieces = [], []
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "a streamed answer"}],
        max_tokens=10,
        stream=True,
        logprobs=True,
    )
    reason = None
    for chunk in stream:
        choice = chunk.choices[0]
        if choice.delta.content:
            arrivals.append(time.perf_counter() - start)
            pieces.append(choice.delta.content)
        reason = choice.finish_reason or reason
    total = time.perf_counter() - start
    assert total >= 10 * TOKEN_MS / 1e3 * 0.9  # the generation itself takes ten tokens' time
    assert arrivals[0] < total / 2  # the first text came long before the generation ended
    assert len(arrivals) >= 5 and arrivals[-1] - arrivals[0] > 4 * TOKEN_MS / 1e3  # spread over it, not in a burst
    assert "".join(pieces) == "echo: a streamed answer"[: len("".join(pieces))] and reason == "length"
    [traj] = finish(gw, info)
    [turn] = traj.turns
    assert turn.response_ids == oracle.reply_ids(turn.prompt_ids)[:10]
    assert turn.logprobs == pytest.approx(oracle.logprobs(turn.response_ids))
    assert turn.weight_version == 5 and turn.finish_reason == "length"
    # the same request unstreamed answers the same text
    info2 = new_session(gw)
    plain = client_for(info2)
    whole = plain.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "a streamed answer"}], max_tokens=10
    )
    assert whole.choices[0].message.content == "".join(pieces)


def test_a_streamed_tool_call_comes_whole_at_the_end_and_the_next_turn_extends_it(gw, oracle):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "user", "content": "CALC: 6 * 7"}]
    content, calls, reason = "", [], None
    for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True, max_tokens=64):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            content += delta.content or ""
            calls += delta.tool_calls or []
            reason = chunk.choices[0].finish_reason or reason
    assert "<tool_call>" not in content and reason == "tool_calls"
    [call] = calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "6 * 7"}
    messages += [
        {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "calculator", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True, max_tokens=64)
        if c.choices
    )
    assert text == "The tool says 42. #### 42"
    [traj] = finish(gw, info)
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1  # the second call extended the first
    context = []
    for turn in traj.turns:
        context += turn.prompt_ids
        assert turn.response_ids == oracle.reply_ids(context)
        context += turn.response_ids


def test_a_streamed_text_completion_and_its_usage(gw, oracle):
    info = new_session(gw)
    client = client_for(info)
    prompt = "<|im_start|>user\nplain text<|im_end|>\n<|im_start|>assistant\n"
    chunks = list(
        client.completions.create(
            model="m", prompt=prompt, max_tokens=64, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    [traj] = finish(gw, info)
    assert text == "echo: plain text" and chunks[-1].usage.completion_tokens == len(traj.turns[0].response_ids)
    assert traj.turns[0].response_ids == oracle.reply_ids(traj.turns[0].prompt_ids)


def test_an_agent_that_leaves_mid_stream_records_nothing_and_the_session_goes_on(gw):
    info = new_session(gw)
    headers = {"Authorization": f"Bearer {info['api_key']}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "leave early"}], "max_tokens": 30, "stream": True}
    before = dict(gw.gateway.counts)
    with httpx.stream("POST", info["base_url"] + "/chat/completions", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if '"content":"e' in line:  # the first text: go away
                break
    deadline = time.monotonic() + 10
    while gw.gateway.inflight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.gateway.inflight == 0  # the generation was given up, not left running
    # counted as what it is (GET /stats): an answer the agent did not take, not a gateway error
    assert gw.gateway.counts["undelivered"] == before["undelivered"] + 1
    assert gw.gateway.counts["errors"] == before["errors"]
    r = httpx.post(
        info["base_url"] + "/chat/completions",
        headers=headers,
        json={"model": "m", "messages": [{"role": "user", "content": "again"}], "max_tokens": 5},
    )
    assert r.status_code == 200
    [traj] = finish(gw, info)
    assert traj.num_turns == 1 and traj.messages[0]["content"] == "again"


def test_a_server_that_refuses_is_an_http_error_not_a_broken_stream():
    mod = standin_server
    server = mod.StandinServer(policy=lambda request: 400)
    server.start()
    try:
        with start_gateway([server.url], model="tiny", health_check_interval=0) as gw:
            info = new_session(gw)
            r = httpx.post(
                info["base_url"] + "/chat/completions",
                headers={"Authorization": f"Bearer {info['api_key']}"},
                json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
            )
            assert r.status_code == 400 and "refused" in r.json()["error"]["message"]
    finally:
        server.stop()


# ---- servers at run time ----------------------------------------------------------------------------
def test_servers_added_and_removed_while_sessions_run(oracle):
    mod = standin_server
    a, b = (mod.StandinServer(policy=mod.BuiltinPolicy("echo"), delay_ms=20) for _ in range(2))
    a.start()
    b.start()
    dead = f"http://127.0.0.1:{mod_free_port()}"
    try:
        with start_gateway([a.url], model="tiny", health_check_interval=0.2) as gw:
            control = httpx.Client(base_url=gw.url, timeout=30, headers=admin(gw))
            r = control.post("/servers", json={"url": dead})
            assert r.status_code == 400 and r.json()["error"]["code"] == "server_unhealthy"
            assert control.delete("/servers", params={"url": a.url}).status_code == 409  # the last one stays
            infos = [control.post("/sessions", json={}).json() for _ in range(8)]
            errors: list[BaseException] = []
            b_added = threading.Event()  # no session may finish before b is in: some of its turns must go there

            def agent(info: dict, turns: int) -> None:
                try:
                    client = client_for(info)
                    messages = []
                    for k in range(turns):
                        if k == turns // 2:
                            b_added.wait(30)
                        messages.append({"role": "user", "content": f"{info['id'][:6]} turn {k}"})
                        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=32)
                        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                        time.sleep(0.05)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=agent, args=(info, 6)) for info in infos]
            for t in threads:
                t.start()
            time.sleep(0.3)
            assert control.post("/servers", json={"url": b.url}).json()["added"]
            b_added.set()
            r = control.delete("/servers", params={"url": a.url})  # waits for a's calls in flight
            assert r.status_code == 200 and [s["url"] for s in r.json()["servers"]] == [b.url]
            served_by_a = len(a.requests)
            for t in threads:
                t.join(60)
            assert not errors, errors
            assert len(a.requests) == served_by_a and len(b.requests) > 0  # nothing went to a after it left
            for info in infos:
                [traj] = [
                    Trajectory.from_dict(t)
                    for t in control.post(f"/sessions/{info['id']}/finish", json={}).json()["trajectories"]
                ]
                assert traj.num_turns == 6  # no session lost a turn
                context = []
                for turn in traj.turns:
                    context += turn.prompt_ids
                    assert turn.response_ids == oracle.reply_ids(context)
                    context += turn.response_ids
            # the health checks: a server that stops answering is marked, and passed over
            control.post("/servers", json={"url": a.url})
            a.stop()
            a = None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                health = {s["url"]: s["healthy"] for s in control.get("/servers").json()["servers"]}
                if not all(health.values()):
                    break
                time.sleep(0.1)
            assert list(health.values()) == [True, False]  # b, then a (added back last)
    finally:
        for server in (a, b):
            if server is not None:
                server.stop()


def mod_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
