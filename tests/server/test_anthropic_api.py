"""The embedded server's Anthropic Messages API (``POST /v1/messages``) through the official
``anthropic`` client, and the one translation to and from the chat path behind it
(``agentgym.server.anthropic_api``).

The tiny model's words are random: tool calls are made certain with ``tool_choice`` (``tool`` /
``any``: the grammar forces a call), and text is compared between two greedy requests.
(This ``anthropic`` release has no ``temperature`` argument: it goes in ``extra_body``.)
"""

from __future__ import annotations

import json

import httpx
import pytest

from agentgym.server.anthropic_api import anthropic_message, chat_body, stop_of
from agentgym.server.anthropic_types import MessagesRequest

anthropic = pytest.importorskip("anthropic")

PICK = {
    "name": "pick",
    "description": "Pick an operation.",
    "input_schema": {
        "type": "object",
        "properties": {"op": {"type": "string", "enum": ["add", "mul"]}},
        "required": ["op"],
        "additionalProperties": False,  # else the grammar lets the tiny model add keys for ever
    },
}
GREEDY = {"temperature": 0.0}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}


@pytest.fixture(scope="module")
def client(embedded_server):
    return anthropic.Anthropic(base_url=embedded_server.url, api_key="unused", max_retries=0)


def blocks(message) -> list[dict]:
    return [b.model_dump(include={"type", "id", "name", "input", "text"}, exclude_none=True) for b in message.content]


# ---- the translation -------------------------------------------------------------------------------
def test_a_messages_request_becomes_the_chat_request_that_asks_the_same():
    req = MessagesRequest.model_validate(
        {
            "model": "tiny",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "What is 2+3?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me add."},
                        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "5"}]},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                        {"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}},
                    ],
                },
            ],
            "tools": [{"name": "add", "description": "Add.", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "metadata": {"user_id": "u1"},
        }
    )
    body = chat_body(req)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "user", "content": "Go on."},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}
    ]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert (body["stop"], body["max_tokens"], body["temperature"], body["top_p"], body["top_k"], body["user"]) == (
        ["END"],
        64,
        0.5,
        0.9,
        5,
        "u1",
    )
    named = MessagesRequest.model_validate(
        {
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}],
            "tools": [{"name": "add", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "add"},
        }
    )
    body = chat_body(named)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False  # a prefill


def test_a_chat_result_becomes_a_messages_result():
    chat = {
        "id": "chatcmpl-abc",
        "model": "tiny",
        "weight_version": 4,
        "usage": {"prompt_tokens": 11, "completion_tokens": 7},
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "Adding.",
                    "tool_calls": [
                        {"id": "call_1", "function": {"name": "add", "arguments": '{"a": 1}'}},
                        {"id": "call_2", "function": {"name": "add", "arguments": '"not an object"'}},
                    ],
                },
            }
        ],
    }
    message = anthropic_message(chat, None, lambda ids: "")
    dumped = message.model_dump()
    assert dumped["id"] == "msg_abc" and dumped["type"] == "message" and dumped["role"] == "assistant"
    assert dumped["content"] == [
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1}},
        # input must be an object: a call whose arguments are not one stays the text the model wrote
        {"type": "text", "text": '<tool_call>\n{"name": "add", "arguments": "not an object"}\n</tool_call>'},
    ]
    assert dumped["stop_reason"] == "tool_use" and dumped["stop_sequence"] is None
    assert dumped["usage"] == {"input_tokens": 11, "output_tokens": 7} and dumped["weight_version"] == 4
    anthropic.types.Message.model_validate(dumped)  # the client's own type reads it

    def decode(ids):
        return "".join(chr(i) for i in ids)

    text = [ord(c) for c in "ab END cd STOP"]
    assert stop_of("stop", False, text, ["STOP", "END"], decode) == ("stop_sequence", "END")
    assert stop_of("stop", False, text, ["STOP"], decode, matched="STOP") == ("stop_sequence", "STOP")
    assert stop_of("stop", False, text, ["XYZ"], decode) == ("end_turn", None)
    assert stop_of("length", True, text, ["END"], decode) == ("max_tokens", None)


# ---- through the server ------------------------------------------------------------------------------
def test_tool_loop_through_the_server(client):
    messages = [{"role": "user", "content": "Add or multiply 2 and 3?"}]
    first = client.messages.create(
        model="default", max_tokens=60, tools=[PICK], tool_choice={"type": "tool", "name": "pick"}, messages=messages
    )
    assert first.type == "message" and first.id.startswith("msg_") and first.model == "tiny"
    [call] = first.content
    assert call.type == "tool_use" and call.name == "pick" and call.input["op"] in ("add", "mul")
    assert first.stop_reason == "tool_use" and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    messages += [
        {"role": "assistant", "content": blocks(first)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "6"}]},
    ]
    answer = client.messages.create(model="default", max_tokens=12, tools=[PICK], messages=messages)
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert 0 < answer.usage.output_tokens <= 12
    # the history (system-prompt tools, the call, the result) is what the second prompt holds
    assert answer.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_streaming_is_the_event_sequence_of_the_plain_answer(client, embedded_server):
    user = [{"role": "user", "content": "Tell me a story."}]
    plain = client.messages.create(model="default", max_tokens=16, messages=user, extra_body=GREEDY)
    with client.messages.stream(model="default", max_tokens=16, messages=user, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    assert text == plain.content[0].text == streamed.content[0].text
    assert streamed.stop_reason == plain.stop_reason and streamed.usage == plain.usage

    body = {"max_tokens": 60, "stream": True, "messages": user, "tools": [PICK]}
    body["tool_choice"] = {"type": "any", "disable_parallel_tool_use": True}  # one call: it fits max_tokens
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", embedded_server.url + "/v1/messages", json=body, headers=headers) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    names = [line[7:] for line in lines if line.startswith("event: ")]
    events = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    assert names == [e["type"] for e in events]
    assert names[:2] == ["message_start", "ping"] and names[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[-1]["type"] == "tool_use" and starts[-1]["name"] == "pick" and starts[-1]["input"] == {}
    partial = [e["delta"] for e in events if e["type"] == "content_block_delta"][-1]
    assert partial["type"] == "input_json_delta" and json.loads(partial["partial_json"])["op"] in ("add", "mul")
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] > 0 and events[0]["message"]["usage"]["input_tokens"] > 0


def test_stop_sequences_end_the_reply(client):
    """A forced call must write ``"op"``: a stop sequence there ends it, whatever the model samples."""
    user = [{"role": "user", "content": "Add or multiply?"}]
    forced = {"tools": [PICK], "tool_choice": {"type": "tool", "name": "pick"}}
    reply = client.messages.create(
        model="default", max_tokens=60, messages=user, stop_sequences=["@@never@@", '"op"'], **forced
    )
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == '"op"'
    [text] = reply.content  # the call was cut before it closed: it stays text
    assert text.type == "text" and text.text.startswith("<tool_call>") and text.text.rstrip().endswith("{")
    assert '"op"' not in text.text
    with client.messages.stream(model="default", max_tokens=60, messages=user, stop_sequences=['"op"'], **forced) as s:
        streamed_text = "".join(s.text_stream)
        streamed = s.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == '"op"'
    assert streamed_text == streamed.content[0].text and streamed_text.rstrip().endswith("{")
    unmatched = client.messages.create(
        model="default", max_tokens=8, messages=user, stop_sequences=["@@never@@"], extra_body=GREEDY
    )
    assert unmatched.stop_reason == "max_tokens" and unmatched.stop_sequence is None


def test_errors_have_anthropics_shape(client, embedded_server):
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-nope", max_tokens=5, messages=user)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "not_found_error"
    cases = [
        ({"messages": user}, "max_tokens"),  # required, as Anthropic requires it
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "reads text only"),
        ({"max_tokens": 5, "messages": user, "tool_choice": {"type": "any"}}, "needs tools"),
        ({"max_tokens": 5, "messages": user, "tool_choice": {"type": "tool"}, "tools": [PICK]}, "name"),
        ({"max_tokens": 5, "messages": user, "tools": [{"type": "web_search_20250305", "name": "w"}]}, "server tools"),
        ({"max_tokens": 5, "messages": user, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 5, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "assistant", "content": [RESULT]}, {"role": "user", "content": "x"}],
            },
            "belong in user messages",
        ),
    ]
    for body, says in cases:
        r = httpx.post(embedded_server.url + "/v1/messages", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert says in r.json()["error"]["message"], (body, r.text)
    r = httpx.post(embedded_server.url + "/v1/messages", content=b"{oops")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_count_tokens_is_the_input_tokens_of_the_same_messages_call(client, embedded_server):
    """``count_tokens`` renders what ``messages.create`` renders: a system prompt, tools (in the
    template's system part), a tool_use / tool_result history and a prefill each count as the call does."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "pick", "input": {"op": "add"}}
    requests = [
        {"messages": [{"role": "user", "content": "Add or multiply 2 and 3?"}]},
        {"system": "Be brief.", "tools": [PICK], "messages": [{"role": "user", "content": "Add or multiply?"}]},
        {
            "system": [{"type": "text", "text": "Use "}, {"type": "text", "text": "tools."}],
            "tools": [PICK],
            "tool_choice": {"type": "auto"},
            "messages": [
                {"role": "user", "content": "Add or multiply?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Picking."}, call]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]},
            ],
        },
        {"messages": [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes, and"}]},
    ]
    counts = []
    for req in requests:
        counted = client.messages.count_tokens(model="default", **req)
        made = client.messages.create(model="default", max_tokens=1, **req)
        assert counted.input_tokens == made.usage.input_tokens > 0, req
        counts.append(counted.input_tokens)
    assert counts[1] > counts[0] and counts[2] > counts[1]  # tools and history are counted, not dropped
    r = httpx.post(embedded_server.url + "/v1/messages/count_tokens", json=requests[0])
    assert r.status_code == 200 and r.json() == {"input_tokens": counts[0]}


def test_count_tokens_errors_have_anthropics_shape(client, embedded_server):
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.count_tokens(model="default", messages=user, tool_choice={"type": "any"})
    assert err.value.status_code == 400 and err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "invalid_request_error" and "needs tools" in err.value.message
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.count_tokens(model="claude-nope", messages=user)
    assert err.value.body["error"]["type"] == "not_found_error"
    image = [{"role": "user", "content": [{"type": "image"}]}]
    for body, says in [({"messages": []}, "messages"), ({"messages": image}, "text only")]:
        r = httpx.post(embedded_server.url + "/v1/messages/count_tokens", json=body)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and says in r.json()["error"]["message"]


def test_an_unserved_anthropic_path_is_answered_in_anthropics_shape(embedded_server):
    """A client of Anthropic's API reads only Anthropic's error shape; other paths keep OpenAI's."""
    r = httpx.post(embedded_server.url + "/v1/messages/batches", json={})
    assert r.status_code == 404 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "not_found_error" and "POST /v1/messages/count_tokens" in r.text
    r = httpx.get(embedded_server.url + "/v1/messages/count_tokens")
    assert r.status_code == 405 and r.json()["type"] == "error" and "POST" in r.json()["error"]["message"]
    r = httpx.post(embedded_server.url + "/v1/nope", json={})
    assert r.status_code == 404 and "type" not in r.json() and r.json()["error"]["code"] == "unknown_url"


def test_a_chat_stream_becomes_messages_events_and_is_closed_with_them():
    import asyncio

    from agentgym.server.anthropic_api import message_events

    def data(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    chunks = [
        data(
            {
                "id": "chatcmpl-x",
                "model": "tiny",
                "prompt_token_ids": [1, 2, 3],
                "choices": [{"delta": {"role": "assistant", "content": ""}}],
            }
        ),
        data({"id": "chatcmpl-x", "choices": [{"delta": {"content": "Hel"}, "token_ids": [7]}]}),
        "data: " + json.dumps({"id": "chatcmpl-x", "choices": [{"delta": {"content": "lo"}, "token_ids": [8]}]}),  # cut
        "\n\n",
        data({"error": {"message": "session s was finished", "type": "conflict_error"}}),
        data({"id": "chatcmpl-x", "choices": [{"delta": {"content": "never sent"}}]}),
    ]
    closed = []

    async def stream():
        try:
            for c in chunks:
                yield c
        finally:
            closed.append(True)

    async def collect(limit=None):
        out = []
        events = message_events(stream(), None, lambda ids: "")
        async for e in events:
            out.append(json.loads(e.split("data: ", 1)[1]))
            if limit and len(out) == limit:
                await events.aclose()  # the client went away
                break
        return out

    events = asyncio.run(collect())
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "error",
    ]
    assert events[0]["message"]["usage"] == {"input_tokens": 3, "output_tokens": 0}
    assert events[0]["message"]["id"] == "msg_x"
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello"
    assert events[-1]["error"] == {"type": "invalid_request_error", "message": "session s was finished"}
    assert closed == [True]
    closed.clear()
    assert len(asyncio.run(collect(limit=2))) == 2 and closed == [True]  # the chat stream (its generation) ends too


def test_structured_output_constrains_the_reply(client):
    """``output_config.format`` (Anthropic's structured outputs; pydantic-ai's ``NativeOutput`` sends
    it) and the beta's top-level ``output_format`` are decoded under the schema, not ignored."""
    schema = {
        "type": "object",
        "properties": {"op": {"type": "string", "enum": ["add", "mul"]}, "ok": {"type": "boolean"}},
        "required": ["op", "ok"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "schema": schema}
    for extra in ({"output_config": {"format": fmt}}, {"output_format": fmt}):
        for _ in range(3):  # the tiny model is random: unconstrained it never writes this object
            reply = client.messages.create(
                model="default",
                max_tokens=60,
                messages=[{"role": "user", "content": "Add or multiply?"}],
                extra_body=extra,
            )
            assert reply.stop_reason == "end_turn", reply
            out = json.loads(reply.content[0].text)
            assert out["op"] in ("add", "mul") and isinstance(out["ok"], bool) and set(out) == {"op", "ok"}
    request = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "output_config": {"format": fmt}}
    assert chat_body(MessagesRequest.model_validate(request))["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }
    with pytest.raises(anthropic.BadRequestError, match="output_config"):
        client.messages.create(
            model="default",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"output_config": {"format": {"type": "xml"}}},
        )
