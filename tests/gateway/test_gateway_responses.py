"""The gateway's Responses API (``/sessions/<id>/v1/responses``): served by the chat path and recorded
token-exactly as turns, whole or streamed, with ``previous_response_id`` resolved within a session."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from agentgym.gateway.serve import start_gateway
from agentgym.model import load_tokenizer
from agentgym.server.tool_calls import parse_tool_calls
from tests.server.test_responses_api import ANSWER, TOOLS
from tests.support.gateway_sessions import admin, finish, session

QUESTION = [{"role": "user", "content": "Count to three."}]
INSTRUCTIONS = "You count with the count tool."


@pytest.fixture(scope="module")
def gw(embedded_server):
    handle = start_gateway([embedded_server.url], model="tiny", max_model_len=4096)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def calls_of(gw, info) -> list[dict]:
    return httpx.get(f"{gw.url}/sessions/{info['id']}/calls", headers=admin(gw)).json()["calls"]


def check_tool_turn(tokenizer, turn, response) -> None:
    """The recorded tokens are the reply the agent got: its function calls, its token count."""
    assert len(turn.response_ids) == len(turn.logprobs) == response.usage.output_tokens
    _, parsed, _ = parse_tool_calls(tokenizer.decode(turn.response_ids, skip_special_tokens=False))
    got = [(o.name, json.loads(o.arguments)) for o in response.output if o.type == "function_call"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == got


def test_a_tool_loop_is_one_trajectory_with_the_tokens_the_agent_got(gw, tokenizer):
    """function_call -> function_call_output -> a JSON answer, the history re-sent as the Agents SDK does:
    one branch extended by each call, every turn's tokens the reply the agent received."""
    info, client = session(gw)
    first = client.responses.create(
        model="tiny",
        instructions=INSTRUCTIONS,
        input=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=200,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and first.status == "completed"
    history = QUESTION + [c.model_dump(exclude_none=True) for c in calls]
    history += [{"type": "function_call_output", "call_id": c.call_id, "output": "3"} for c in calls]
    answer = client.responses.create(
        model="tiny",
        instructions=INSTRUCTIONS,
        input=history,
        tools=TOOLS,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}},
        max_output_tokens=50,
    )
    [traj] = finish(gw, info)
    assert traj.num_turns == 2 and all(t.shaped_by == ["grammar"] for t in traj.turns)
    check_tool_turn(tokenizer, traj.turns[0], first)
    second = traj.turns[1]
    if answer.status == "incomplete":  # the random-weights model may chain calls past the 50 tokens
        assert answer.incomplete_details.reason == "max_output_tokens"
        assert len(second.response_ids) == answer.usage.output_tokens == 50
    elif any(o.type == "function_call" for o in answer.output):  # tools beside text.format under "auto":
        check_tool_turn(tokenizer, second, answer)  # the grammar allows a call or the JSON
    else:
        jsonschema.validate(json.loads(answer.output_text), ANSWER)
        assert tokenizer.decode(second.response_ids, skip_special_tokens=True) == answer.output_text
    assert len(second.response_ids) == answer.usage.output_tokens
    assert len(traj.turns[0].prompt_ids) == first.usage.input_tokens
    assert (
        len(traj.turns[0].prompt_ids) + len(traj.turns[0].response_ids) + len(second.prompt_ids)
        == answer.usage.input_tokens
    )
    assert [c["endpoint"] for c in calls_of(gw, info)] == ["responses", "responses"]


def test_previous_response_id_continues_the_same_branch(gw, tokenizer):
    info, client = session(gw)
    first = client.responses.create(
        model="tiny",
        instructions=INSTRUCTIONS,
        input=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=200,
    )
    outputs = [
        {"type": "function_call_output", "call_id": o.call_id, "output": "3"}
        for o in first.output
        if o.type == "function_call"
    ]
    second = client.responses.create(
        model="tiny",
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        input=outputs,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "count"},
        max_output_tokens=200,
    )
    assert second.previous_response_id == first.id and second.output[0].name == "count"
    third = client.responses.create(
        model="tiny",
        instructions=INSTRUCTIONS,
        previous_response_id=second.id,
        input=[{"type": "function_call_output", "call_id": second.output[0].call_id, "output": "done"}],
        tools=TOOLS,
        tool_choice={"type": "function", "name": "stop"},
        max_output_tokens=100,
        store=False,
    )
    assert third.store is False and third.output[0].name == "stop"
    with pytest.raises(openai.BadRequestError) as err:  # store=false: not kept
        client.responses.create(model="tiny", previous_response_id=third.id, input="more")
    assert err.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", previous_response_id="resp_unknown", input="more")
    _, other = session(gw)  # another session's response is not this one's
    with pytest.raises(openai.BadRequestError):
        other.responses.create(model="tiny", previous_response_id=first.id, input="more")
    [traj] = finish(gw, info)
    assert traj.num_turns == 3
    for turn, response in zip(traj.turns, (first, second, third)):
        check_tool_turn(tokenizer, turn, response)
    assert [c["plan"] for c in calls_of(gw, info)] == ["fresh", "extend", "extend"]


def test_a_streamed_response_is_recorded_as_the_agent_received_it(gw, tokenizer):
    info, client = session(gw)
    stream = client.responses.create(
        model="tiny",
        input="Hello there",
        tools=TOOLS,  # the same tools on every call: one branch (other tools render another prompt)
        max_output_tokens=8,
        include=["message.output_text.logprobs"],
        stream=True,
    )
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    streamed_logprobs = [lp.logprob for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    with client.responses.stream(
        model="tiny", previous_response_id=final.id, input="Count.", tools=TOOLS, tool_choice="required"
    ) as tool_stream:
        kinds = [e.type for e in tool_stream]
        tool_final = tool_stream.get_final_response()
    assert kinds[-1] == "response.completed" and "response.function_call_arguments.done" in kinds
    [traj] = finish(gw, info)
    text_turn, tool_turn = traj.turns
    assert deltas == final.output_text == tokenizer.decode(text_turn.response_ids, skip_special_tokens=True)
    assert len(text_turn.response_ids) == final.usage.output_tokens == 8
    assert streamed_logprobs == pytest.approx(text_turn.logprobs, abs=1e-6)
    assert [lp.logprob for lp in final.output[0].content[0].logprobs] == pytest.approx(text_turn.logprobs, abs=1e-6)
    check_tool_turn(tokenizer, tool_turn, tool_final)


def test_bad_responses_requests_are_400s_at_the_gateway(gw):
    info, client = session(gw)
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        client.responses.create(model="tiny", input="hi", tools=[{"type": "file_search"}])
    with pytest.raises(openai.BadRequestError, match="item_reference"):
        client.responses.create(model="tiny", input=[{"type": "item_reference", "id": "msg_1"}])
    assert finish(gw, info) == []  # nothing was recorded


def test_an_agent_that_leaves_a_responses_stream_records_nothing():
    """The Responses stream wraps the chat stream: an agent that goes away mid-stream cancels the
    generation and no turn is recorded, as with chat completions."""
    import time

    from tests.support import standin_server

    slow = standin_server.StandinServer(policy=standin_server.BuiltinPolicy("echo"), token_delay_ms=60)
    slow.start()
    try:
        with start_gateway([slow.url], model="tiny", health_check_interval=0) as handle:
            info, _ = session(handle)
            headers = {"Authorization": f"Bearer {info['api_key']}"}
            body = {"model": "m", "input": "leave early please", "max_output_tokens": 30, "stream": True}
            with httpx.stream("POST", info["base_url"] + "/responses", json=body, headers=headers) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if "response.output_text.delta" in line:  # the first text: go away
                        break
            deadline = time.monotonic() + 10
            while handle.gateway.inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert handle.gateway.inflight == 0  # the generation was given up, not left running
            assert finish(handle, info) == []
    finally:
        slow.stop()
