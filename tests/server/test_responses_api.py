"""The policy server's Responses API (``POST /v1/responses``) through the official ``openai`` client:
text, the tool loop, structured output, streaming events, logprobs and errors, against the tiny model."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

ARGS = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "mode": {"enum": ["fast", "slow"]}},
    "required": ["n", "mode"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "count", "description": "Count.", "parameters": ARGS, "strict": True},
    {
        "type": "function",
        "name": "stop",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(embedded_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedded_server.url + "/v1", api_key="none", max_retries=0)


def test_text_is_the_chat_reply_and_max_output_tokens_is_incomplete(client):
    """A response is the chat completion it stands for: the same greedy text, the same token counts."""
    r = client.responses.create(
        model="default", instructions="Be brief.", input="Say hi.", max_output_tokens=6, temperature=0
    )
    chat = client.chat.completions.create(
        model="default",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
        max_tokens=6,
        temperature=0,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 6
    assert r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert r.instructions == "Be brief." and r.max_output_tokens == 6


def test_the_tool_loop_and_structured_output(client):
    """function_call -> function_call_output -> the answer, as an agent loop sends it back."""
    question = [{"role": "user", "content": [{"type": "input_text", "text": "Count to three."}]}]
    first = client.responses.create(
        model="default", input=question, tools=TOOLS, tool_choice="required", max_output_tokens=200
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and calls and len(calls) == len(first.output)
    for call in calls:
        assert call.call_id and call.id.startswith("fc_") and call.name in ("count", "stop")
        if call.name == "count":
            jsonschema.validate(json.loads(call.arguments), ARGS)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "done"} for c in calls]
    history = question + [c.model_dump(exclude_none=True) for c in calls] + outputs
    named = client.responses.create(
        model="default",
        input=history,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "count"},
        max_output_tokens=200,
    )
    [call] = named.output
    assert call.type == "function_call" and call.name == "count"
    jsonschema.validate(json.loads(call.arguments), ARGS)
    history += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
    ]
    answer = client.responses.create(
        model="default",
        input=history,
        tools=TOOLS,
        tool_choice="none",  # under "auto" the union grammar lets the model call a tool again instead
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}},
        max_output_tokens=50,
    )
    assert answer.status == "completed"
    jsonschema.validate(json.loads(answer.output_text), ANSWER)
    assert answer.text.format.type == "json_schema"


def test_the_stream_is_openais_event_sequence(client):
    """Text: created, in_progress, item added, part added, deltas, text done, part done, item done,
    then the terminal event; sequence numbers count from 0; the deltas add up to the final text."""
    stream = client.responses.create(model="default", input="Hello", max_output_tokens=5, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas) and deltas
    assert kinds[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = events[-1].response
    assert final.output_text == "".join(deltas) == events[-4].text
    assert final.usage.output_tokens == 5 and final.incomplete_details.reason == "max_output_tokens"
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id

    with client.responses.stream(
        model="default", input="Count.", tools=TOOLS, tool_choice={"type": "function", "name": "count"}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [call] = final.output
    assert events[4].arguments == call.arguments and events[5].item.call_id == call.call_id
    jsonschema.validate(json.loads(call.arguments), ARGS)
    assert final.status == "completed"


def test_logprobs_are_the_chat_paths(client):
    """``include=["message.output_text.logprobs"]``: each token's logprob and alternatives, as chat gives them."""
    r = client.responses.create(
        model="default",
        input="Hi",
        max_output_tokens=4,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    chat = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == r.usage.output_tokens == 4
    assert all(len(lp.top_logprobs) == 2 for lp in logprobs)
    expected = chat.choices[0].logprobs.content
    assert [lp.token for lp in logprobs] == [lp.token for lp in expected]
    assert [lp.logprob for lp in logprobs] == pytest.approx([lp.logprob for lp in expected], abs=2e-4)
    calls = client.responses.create(
        model="default",
        input="Count.",
        tools=TOOLS,
        tool_choice="required",
        include=["message.output_text.logprobs"],
        max_output_tokens=200,
    )
    assert {o.type for o in calls.output} == {"function_call"}  # no empty message for the call's tokens


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "keeps no responses"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "reads text only"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "'reasoning' item"),
        ({"input": "hi", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "nope"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": ""}, "input"),
        ({}, "input"),
    ],
)
def test_bad_requests_are_400s_that_say_why(embedded_server, body, says):
    r = httpx.post(embedded_server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_an_error_of_the_chat_request_names_the_responses_field(embedded_server):
    body = {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": "not a schema"}}}
    r = httpx.post(embedded_server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format", r.text


def test_the_openai_client_sees_errors_as_its_own(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="another-model", input="hi")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="default", input="hi", previous_response_id="resp_x")
    assert err.value.code == "previous_response_not_found"


def test_a_chat_stream_becomes_responses_events_text_then_calls_then_the_end():
    """The translation itself, on chat chunks as both the server and the gateway send them: text, then the
    tool calls parsed at the end, usage, [DONE]; an error chunk becomes an ``error`` event."""
    import asyncio

    from agentgym.server.responses_api import ResponseBuilder, stream_events
    from agentgym.server.responses_types import ResponsesRequest

    def data(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"

    call = {"id": "call_1", "type": "function", "function": {"name": "count", "arguments": '{"n": 1}'}}
    chunks = [
        data({"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        data({"model": "m", "choices": [{"index": 0, "delta": {"content": "Let me "}}]}),
        data({"model": "m", "choices": [{"index": 0, "delta": {"content": "count."}}]}),
        data({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **call}]}}]}),
        data({"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        data({"model": "m", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}),
        "data: [DONE]\n\n",
    ]

    async def source(items):
        for item in items:
            yield item

    async def run(items) -> list[dict]:
        builder = ResponseBuilder(ResponsesRequest(input="hi"))
        out = [e async for e in stream_events(source(items), builder)]
        return [json.loads(e.split("data: ", 1)[1]) for e in out]

    events = asyncio.run(run(chunks))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    message, function_call = final["output"]
    assert message["content"][0]["text"] == "Let me count." and message["status"] == "completed"
    assert function_call["call_id"] == "call_1" and function_call["arguments"] == '{"n": 1}'
    assert events[9]["output_index"] == 1 and events[9]["item"]["arguments"] == ""
    assert final["usage"]["input_tokens"] == 7 and final["usage"]["output_tokens"] == 5
    assert final["status"] == "completed" and final["model"] == "m"

    broken = asyncio.run(run([chunks[1], data({"error": {"message": "server gone", "code": "upstream"}})]))
    assert broken[-1]["type"] == "error" and broken[-1]["message"] == "server gone"
    assert "response.completed" not in [e["type"] for e in broken]


def test_a_call_cut_by_max_output_tokens_is_an_incomplete_item(client):
    """A forced call cut short is handed over (as chat hands a cut call over) but marked for what it is:
    its ``function_call`` item is ``incomplete``, streamed or not, as the response is."""
    body = {"model": "default", "input": "Count.", "tools": TOOLS[:1], "tool_choice": "required"}
    whole = client.responses.create(**body, max_output_tokens=3)
    with client.responses.stream(**body, max_output_tokens=3) as stream:
        done = [e.item for e in stream if e.type == "response.output_item.done"]
    for items in (whole.output, done):
        [item] = items
        assert item.type == "function_call" and item.name == "count" and item.status == "incomplete"
    assert whole.status == "incomplete"
    finished = client.responses.create(**body, max_output_tokens=60, parallel_tool_calls=False)
    assert finished.status == "completed" and [o.status for o in finished.output] == ["completed"]
