"""What agent frameworks send, through the gateway (over the embedded server with the tiny model, the
official ``openai`` client): tools beside ``response_format`` under ``auto`` (a call, then the JSON), the
legacy ``functions`` / ``function_call``, a forced call cut by ``max_tokens``, an unserved path. Each
recorded turn is checked token for token against what the agent received (``return_token_ids``), and a
conversation continued in the legacy shape must extend the recorded branch, not fork it."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from agentgym.gateway.serve import start_gateway
from tests.server.test_agent_requests import ANSWER, ARGS, MESSAGES, NOTE, RESPONSE_FORMAT, TOOLS
from tests.support.gateway_sessions import finish, session

FUNCTIONS = [t["function"] for t in TOOLS]
IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def server(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def gw(server):
    handle = start_gateway([server.url], model="tiny", max_model_len=4096)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def bias(server):
    token = server.engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    return lambda value: {str(token): value}


def test_a_tool_call_then_the_json_under_auto_with_response_format(gw, bias):
    info, client = session(gw)
    kw = {"model": "tiny", "tools": TOOLS, "response_format": RESPONSE_FORMAT, "max_tokens": 120, "extra_body": IDS}
    kw["parallel_tool_calls"] = False  # one call: it always ends well within max_tokens
    first = client.chat.completions.create(messages=MESSAGES, logit_bias=bias(100), **kw)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls
    history = [
        *MESSAGES,
        message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": "42"} for c in message.tool_calls),
    ]
    second = client.chat.completions.create(messages=history, logit_bias=bias(-100), **kw)
    assert second.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(second.choices[0].message.content), ANSWER)
    [traj] = finish(gw, info)  # one branch: the second call extended the first
    assert [t.response_ids for t in traj.turns] == [
        first.choices[0].model_extra["token_ids"],
        second.choices[0].model_extra["token_ids"],
    ]
    assert all(t.shaped_by == ["grammar", "logit_bias"] for t in traj.turns)


def test_legacy_functions_through_the_gateway(gw, server):
    info, client = session(gw)
    first = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        functions=FUNCTIONS,
        function_call={"name": "lookup"},
        max_tokens=120,
        extra_body=IDS,
    )
    call = first.choices[0].message.function_call
    assert first.choices[0].finish_reason == "function_call" and call.name == "lookup"
    assert not first.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.arguments), ARGS)
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "function_call": {"name": call.name, "arguments": call.arguments}},
        {"role": "function", "name": "lookup", "content": "found: 42"},
    ]
    stream = client.chat.completions.create(
        model="tiny",
        messages=history,
        functions=FUNCTIONS,
        function_call={"name": "list_keys"},
        max_tokens=120,
        stream=True,
        extra_body=IDS,
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    calls = [c.delta.function_call for c in chunks if c.delta.function_call]
    assert [c.name for c in calls] == ["list_keys"] and chunks[-1].finish_reason == "function_call"
    streamed_ids = [t for c in chunks for t in (c.model_extra or {}).get("token_ids") or []]
    [traj] = finish(gw, info)  # the legacy history matched the recorded reply: the branch went on
    assert [t.response_ids for t in traj.turns] == [first.choices[0].model_extra["token_ids"], streamed_ids]
    assert "found: 42" in server.engine.tokenizer.decode(traj.turns[1].prompt_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_forced_call_through_the_gateway(gw, server, stream):
    info, client = session(gw)
    kw = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": [*TOOLS, NOTE],
        "tool_choice": {"type": "function", "function": {"name": "note"}},
        "max_tokens": 40,
        "extra_body": IDS,
    }
    if stream:
        chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        calls = [t for c in chunks for t in c.delta.tool_calls or []]
        finish_reason, content = chunks[-1].finish_reason, "".join(c.delta.content or "" for c in chunks)
        ids = [t for c in chunks for t in (c.model_extra or {}).get("token_ids") or []]
    else:
        r = client.chat.completions.create(**kw)
        calls, finish_reason, content = r.choices[0].message.tool_calls, r.choices[0].finish_reason, ""
        ids = r.choices[0].model_extra["token_ids"]
    assert finish_reason == "length" and not content and [c.function.name for c in calls] == ["note"]
    [traj] = finish(gw, info)
    assert traj.turns[0].response_ids == ids
    written = server.engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert calls[0].function.arguments and written.endswith(calls[0].function.arguments)


def test_an_unserved_path_at_the_gateway(gw):
    info, client = session(gw)
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="tiny", input="hi")  # no embeddings API here
    message = err.value.body["message"]
    assert "gateway" in message and "/sessions/{sid}/v1/chat/completions" in message and "openai_api.md" in message
    root = httpx.post(gw.url + "/v1/chat/completions", json={})
    assert root.status_code == 404 and root.json()["error"]["code"] == "no_session"
    finish(gw, info)
