"""The gateway's Anthropic Messages API (``POST /sessions/<id>/v1/messages``) through the official
``anthropic`` client: a tool loop recorded token-exactly as one trajectory, streaming, stop
sequences, keys sent as ``x-api-key``, and errors in Anthropic's shape.

Against the stand-in policy server in echo mode (``tests/support/standin_server.py``: ``CALC: x``
gets a calculator call, a tool result ``The tool says <r>. #### <r>``, anything else ``echo: ...``),
so what the model answers is known; one test runs the tiny model on the embedded server.
"""

from __future__ import annotations

import json

import httpx
import pytest

from agentgym.gateway.agent_source import load_agent
from agentgym.gateway.serve import start_gateway
from agentgym.model import load_tokenizer
from tests.gateway.test_gateway import assert_sampled_by_server, assert_token_views_consistent, finish, new_session

anthropic = pytest.importorskip("anthropic")


CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def client_for(info: dict):
    return anthropic.Anthropic(base_url=info["anthropic_base_url"], api_key=info["api_key"], max_retries=0)


def test_tool_loop_is_one_token_exact_trajectory(gw, oracle, tok):
    info = new_session(gw, task={"reward_fn": "gsm8k", "ground_truth": "27"}, group_id="g-anthropic")
    assert info["anthropic_base_url"] + "/v1" == info["base_url"]
    client = client_for(info)
    messages = [{"role": "user", "content": "CALC: 48 / 2 + 3"}]
    first = client.messages.create(
        model="tiny", max_tokens=200, system="Use tools.", tools=[CALCULATOR], messages=messages
    )
    assert first.type == "message" and first.role == "assistant" and first.id.startswith("msg_")
    assert first.stop_reason == "tool_use" and first.stop_sequence is None
    [call] = first.content
    assert call.type == "tool_use" and call.name == "calculator" and call.input == {"expression": "48 / 2 + 3"}
    messages += [
        {
            "role": "assistant",
            "content": [b.model_dump(include={"type", "id", "name", "input"}) for b in first.content],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "27"}]},
    ]
    second = client.messages.create(
        model="tiny", max_tokens=200, system="Use tools.", tools=[CALCULATOR], messages=messages
    )
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == "The tool says 27. #### 27" and second.stop_reason == "end_turn"

    [traj] = finish(gw, info)
    assert traj.group_id == "g-anthropic" and traj.num_turns == 2 and traj.metrics["branches"] == 1
    assert traj.outcome_reward == 1.0  # the task's reward function read the Messages reply
    assert traj.messages[0] == {"role": "system", "content": "Use tools."}
    assert traj.messages[3] == {"role": "tool", "content": "27", "tool_call_id": call.id}
    # the recorded tokens are what the client was told it got and sent
    for turn, reply in zip(traj.turns, (first, second)):
        assert reply.usage.output_tokens == len(turn.response_ids)
        assert turn.weight_version == 3 and reply.model_extra["weight_version"] == 3
    assert first.usage.input_tokens == len(traj.turns[0].prompt_ids)
    assert second.usage.input_tokens == len(traj.token_ids()) - len(traj.turns[1].response_ids)
    assert tok.decode(traj.turns[1].response_ids, skip_special_tokens=True) == second.content[0].text
    assert "<tool_response>\n27\n</tool_response>" in tok.decode(traj.turns[1].prompt_ids)
    assert_sampled_by_server(traj, oracle)
    assert_token_views_consistent(traj)


def test_the_anthropic_example_agent_is_recorded_and_rewarded(gw, oracle):
    agent = load_agent("examples.anthropic_agent:run")
    info = new_session(gw, task={"reward_fn": "gsm8k", "ground_truth": "27"}, group_id="g-example")
    assert agent(info["base_url"], info["api_key"], {"question": "CALC: 48 / 2 + 3"}) == "The tool says 27. #### 27"
    [traj] = finish(gw, info)
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1 and traj.outcome_reward == 1.0
    assert traj.messages[2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert traj.messages[3]["content"] == "27"
    assert_sampled_by_server(traj, oracle)


def test_streamed_tool_loop_matches_and_extends_the_branch(gw, tok):
    info = new_session(gw)
    client = client_for(info)
    messages = [{"role": "user", "content": "CALC: 6 * 7"}]
    with client.messages.stream(model="tiny", max_tokens=200, tools=[CALCULATOR], messages=messages) as stream:
        kinds = [e.type for e in stream]
        first = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "input_json" in kinds
    [call] = first.content
    assert call.type == "tool_use" and call.input == {"expression": "6 * 7"} and first.stop_reason == "tool_use"
    messages += [
        {"role": "assistant", "content": [call.model_dump(include={"type", "id", "name", "input"})]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "42"}]}],
        },
    ]
    with client.messages.stream(model="tiny", max_tokens=200, tools=[CALCULATOR], messages=messages) as stream:
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert text == second.content[0].text == "The tool says 42. #### 42" and second.stop_reason == "end_turn"
    [traj] = finish(gw, info)
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1  # the streamed reply re-sent extends it
    for turn, reply in zip(traj.turns, (first, second)):
        assert reply.usage.output_tokens == len(turn.response_ids)
    assert first.usage.input_tokens == len(traj.turns[0].prompt_ids)
    assert tok.decode(traj.turns[1].response_ids, skip_special_tokens=True) == text


def test_event_sequence_on_the_wire(gw):
    info = new_session(gw)
    body = {"model": "m", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": info["api_key"], "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", info["anthropic_base_url"] + "/v1/messages", json=body, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "echo: hi"
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    [traj] = finish(gw, info)
    assert events[-2]["usage"]["output_tokens"] == len(traj.turns[0].response_ids)
    assert events[0]["message"]["usage"]["input_tokens"] == len(traj.turns[0].prompt_ids)


def test_stop_sequences_and_max_tokens(gw):
    info = new_session(gw)
    client = client_for(info)
    user = [{"role": "user", "content": "abc STOP def END"}]
    reply = client.messages.create(model="m", max_tokens=100, messages=user, stop_sequences=["END", "STOP"])
    assert reply.content[0].text == "echo: abc " and reply.stop_reason == "stop_sequence"
    assert reply.stop_sequence == "STOP"  # the one that ended it, not the first listed
    with client.messages.stream(model="m", max_tokens=100, messages=user, stop_sequences=["STOP"]) as stream:
        assert "".join(stream.text_stream) == "echo: abc "
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == "STOP"
    short = client.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "a long message"}])
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    trajs = finish(gw, info)
    assert "STOP" in trajs[0].turns[0].response_text  # the model's context keeps what it sampled


def calls_of(gw, info: dict) -> list[dict]:
    r = httpx.get(f"{gw.url}/sessions/{info['id']}/calls", headers={"x-api-key": info["api_key"]})
    assert r.status_code == 200, r.text
    return r.json()["calls"]


def test_count_tokens_is_the_prompt_the_session_would_sample_and_records_nothing(gw):
    """The count is the prompt the call is sampled from in the session (``usage.input_tokens``):
    fresh, and on the branch a tool loop's second call extends. Counting is no model call."""
    info = new_session(gw)
    client = client_for(info)
    ask = {"system": "Use tools.", "tools": [CALCULATOR], "messages": [{"role": "user", "content": "CALC: 6 * 7"}]}
    counted = client.messages.count_tokens(model="tiny", **ask)
    assert calls_of(gw, info) == []  # counting is not a model call
    first = client.messages.create(model="tiny", max_tokens=200, **ask)
    assert counted.input_tokens == first.usage.input_tokens > 0
    [call] = first.content
    ask["messages"] += [
        {"role": "assistant", "content": [call.model_dump(include={"type", "id", "name", "input"})]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]},
    ]
    r = httpx.post(
        info["anthropic_base_url"] + "/v1/messages/count_tokens",
        json={"model": "tiny", **ask},
        headers={"Authorization": f"Bearer {info['api_key']}"},  # the key as a Bearer token works too
    )
    assert r.status_code == 200, r.text
    assert len(calls_of(gw, info)) == 1
    second = client.messages.create(model="tiny", max_tokens=200, **ask)
    assert r.json() == {"input_tokens": second.usage.input_tokens}
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    [traj] = finish(gw, info)
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1  # the counts made no turn and no branch


def test_count_tokens_errors_have_anthropics_shape(gw):
    a, b = new_session(gw), new_session(gw)
    user = [{"role": "user", "content": "hi"}]
    client = client_for(a)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.count_tokens(model="m", messages=user, tool_choice={"type": "any"})
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "needs tools" in err.value.message
    with pytest.raises(anthropic.BadRequestError, match="new assistant turn"):  # a prefill: the gateway takes none
        client.messages.count_tokens(model="m", messages=[*user, {"role": "assistant", "content": "Hel"}])
    wrong = anthropic.Anthropic(base_url=a["anthropic_base_url"], api_key=b["api_key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        wrong.messages.count_tokens(model="m", messages=user)
    assert err.value.body["error"]["type"] == "permission_error"
    r = httpx.post(a["anthropic_base_url"] + "/v1/messages/count_tokens", json={"messages": user})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(a["anthropic_base_url"] + "/v1/messages/batches", json={}, headers={"x-api-key": a["api_key"]})
    assert r.status_code == 404 and r.json()["type"] == "error", r.text  # unserved, in Anthropic's shape
    assert r.json()["error"]["type"] == "not_found_error" and "messages/count_tokens" in r.json()["error"]["message"]
    assert finish(gw, a) == [] and finish(gw, b) == []


def test_keys_and_errors_have_anthropics_shape(gw):
    a, b = new_session(gw), new_session(gw)
    user = [{"role": "user", "content": "hi"}]
    wrong = anthropic.Anthropic(base_url=a["anthropic_base_url"], api_key=b["api_key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        wrong.messages.create(model="m", max_tokens=10, messages=user)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "permission_error"
    assert "belongs to another session" in err.value.body["error"]["message"]
    r = httpx.post(a["anthropic_base_url"] + "/v1/messages", json={"max_tokens": 5, "messages": user})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in r.json()["error"]["message"]

    client = client_for(a)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]
        )
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "reads text only" in err.value.message
    with pytest.raises(anthropic.BadRequestError, match="needs tools"):
        client.messages.create(model="m", max_tokens=10, messages=user, tool_choice={"type": "any"})
    headers = {"x-api-key": a["api_key"]}
    r = httpx.post(a["anthropic_base_url"] + "/v1/messages", json={"messages": user}, headers=headers)
    assert r.status_code == 400 and r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(a["anthropic_base_url"] + "/v1/messages", content=b"{not json", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(gw.url + "/sessions/nope/v1/messages", json={"max_tokens": 5, "messages": user}, headers=headers)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    misdirected = anthropic.Anthropic(base_url=a["base_url"], api_key=a["api_key"], max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="anthropic_base_url"):  # the OpenAI base_url: /v1/v1
        misdirected.messages.create(model="m", max_tokens=10, messages=user)
    assert finish(gw, a) == [] and finish(gw, b) == []  # nothing failed was recorded


def test_over_the_embedded_tiny_model_the_recorded_call_is_what_the_client_got(embedded_server, tok):
    pick = {
        "name": "pick",
        "input_schema": {
            "type": "object",
            "properties": {"op": {"type": "string", "enum": ["add", "mul"]}},
            "required": ["op"],
            "additionalProperties": False,  # else the grammar lets the tiny model add keys for ever
        },
    }
    with start_gateway([embedded_server.url], model="tiny") as handle:
        info = new_session(handle, sampling={"temperature": 0.0})
        client = client_for(info)
        messages = [{"role": "user", "content": "Add or multiply?"}]
        first = client.messages.create(
            model="tiny", max_tokens=60, tools=[pick], tool_choice={"type": "tool", "name": "pick"}, messages=messages
        )
        [call] = first.content
        assert call.type == "tool_use" and call.name == "pick" and call.input["op"] in ("add", "mul")
        assert first.stop_reason == "tool_use"
        messages += [
            {"role": "assistant", "content": [call.model_dump(include={"type", "id", "name", "input"})]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok", "is_error": True}],
            },
        ]
        with client.messages.stream(model="tiny", max_tokens=8, tools=[pick], messages=messages) as stream:
            text = "".join(stream.text_stream)
            second = stream.get_final_message()
        [traj] = finish(handle, info)
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1
    assert traj.messages[2] == {
        "role": "tool",
        "content": "Error: ok",
        "tool_call_id": call.id,
    }  # is_error reaches the model's context
    for turn, reply in zip(traj.turns, (first, second)):
        assert reply.usage.output_tokens == len(turn.response_ids)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    if second.stop_reason != "tool_use":
        assert tok.decode(traj.turns[1].response_ids, skip_special_tokens=True).startswith(text)
    assert_token_views_consistent(traj)


def test_a_cut_tool_use_sent_back_extends_its_branch(embedded_server):
    """A forced call cut by ``max_tokens`` before its arguments reaches the client as a ``tool_use``
    with ``input: {}`` (recorded with arguments ``""``); an agent that runs it and sends it back
    continues the same trajectory instead of starting a branch of its own."""
    pick = {
        "name": "pick",
        "input_schema": {
            "type": "object",
            "properties": {"op": {"type": "string", "enum": ["add", "mul"]}},
            "required": ["op"],
            "additionalProperties": False,
        },
    }
    with start_gateway([embedded_server.url], model="tiny") as handle:
        info = new_session(handle, sampling={"temperature": 0.0})
        client = client_for(info)
        messages = [{"role": "user", "content": "Add or multiply?"}]
        first = client.messages.create(
            model="tiny", max_tokens=3, tools=[pick], tool_choice={"type": "tool", "name": "pick"}, messages=messages
        )
        [call] = first.content
        assert first.stop_reason == "max_tokens" and call.type == "tool_use" and call.input == {}
        messages += [
            {"role": "assistant", "content": [call.model_dump(include={"type", "id", "name", "input"})]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "no input"}]},
        ]
        client.messages.create(model="tiny", max_tokens=4, tools=[pick], messages=messages)
        trajectories = finish(handle, info)
    assert len(trajectories) == 1, [t.messages for t in trajectories]
    [traj] = trajectories
    assert traj.num_turns == 2 and traj.metrics["branches"] == 1
    assert_token_views_consistent(traj)
