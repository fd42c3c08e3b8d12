"""The gateway passes on what agent frameworks ask for, and records only what the agent received:
forced tool calls, JSON output, penalties and logit_bias, top_logprobs, 400s; an agent that times out
leaves no turn behind. Over the embedded server with the tiny model (one per module), through the
official ``openai`` client."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

from agentgym.gateway.serve import start_gateway
from agentgym.model import load_causal_lm
from tests.support.fidelity import logprob_tolerance, teacher_forced
from tests.support.gateway_sessions import finish, session

ARGS = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "mode": {"enum": ["fast", "slow"]}},
    "required": ["n", "mode"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "count", "parameters": ARGS}},
    {
        "type": "function",
        "function": {"name": "stop", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    },
]
MESSAGES = [{"role": "user", "content": "Count to three."}]


@pytest.fixture(scope="module")
def server(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def gw(server):
    handle = start_gateway([server.url], model="tiny", max_model_len=4096)
    yield handle
    handle.stop()


def test_forced_tool_calls_and_json_through_the_gateway(gw, server):
    info, client = session(gw)
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200, seed=1
    )
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    named = client.chat.completions.create(
        model="tiny",
        max_tokens=200,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "count"}},
        messages=[
            *MESSAGES,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"},
        ],
    )
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["count"]
    jsonschema.validate(json.loads(named.choices[0].message.tool_calls[0].function.arguments), ARGS)
    [traj] = finish(gw, info)
    assert traj.num_turns == 2 and all(t.shaped_by == ["grammar"] for t in traj.turns)
    assert traj.metrics["shaped_turns"] == 2
    # the turn's logprobs are the model's own distribution, whatever the grammar allowed
    model = load_causal_lm("tiny")
    context: list[int] = []
    for turn in traj.turns:
        context += turn.prompt_ids
        expected = teacher_forced(model, context, turn.response_ids)
        assert max(abs(a - b) for a, b in zip(turn.logprobs, expected)) < logprob_tolerance(server.engine.model.dtype)
        context += turn.response_ids

    info, client = session(gw)
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=200,
        seed=2,
        response_format={"type": "json_schema", "json_schema": {"name": "args", "schema": ARGS}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), ARGS)
    [traj] = finish(gw, info)
    assert traj.turns[0].shaped_by == ["grammar"]


def test_penalties_and_logit_bias_reach_the_server(gw):
    info, client = session(gw, sampling={"temperature": 0.0})
    pinned, pinned_client = session(gw, sampling={"temperature": 0.0, "frequency_penalty": 2.0, "presence_penalty": 2})
    forced = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=12,
        logit_bias={"88": 100},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert set(forced.choices[0].model_extra["token_ids"]) == {88}
    plain = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "again"}],
        max_tokens=16,
        extra_body={"return_token_ids": True},
    )
    penalized = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "again"}],
        max_tokens=16,
        frequency_penalty=2.0,
        presence_penalty=2.0,
        extra_body={"return_token_ids": True},
    )
    ids = penalized.choices[0].model_extra["token_ids"]
    assert ids != plain.choices[0].model_extra["token_ids"]
    again = pinned_client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "again"}],
        max_tokens=16,
        extra_body={"return_token_ids": True},
    )
    assert again.choices[0].model_extra["token_ids"] == ids  # the session's pinned penalties, the same reply
    finish(gw, pinned)
    assert len(set(ids[:-1])) == len(ids[:-1])  # penalties this strong never repeat a token under greedy
    trajectories = finish(gw, info)
    assert {tuple(t.turns[0].shaped_by) for t in trajectories} == {("logit_bias",), (), ("penalties",)}


def test_top_logprobs_have_the_requested_length(gw):
    info, client = session(gw)
    for k in (1, 5):
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, logprobs=True, top_logprobs=k)
        content = r.choices[0].logprobs.content
        assert content and all(len(t.top_logprobs) == k for t in content)
        for t in content:  # sorted, best first, and the sampled token cannot beat the best alternative
            values = [a.logprob for a in t.top_logprobs]
            assert values == sorted(values, reverse=True) and t.logprob <= values[0] + 1e-6
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, logprobs=True, top_logprobs=3, stream=True
    )
    tops = [
        len(t.top_logprobs)
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for t in chunk.choices[0].logprobs.content
    ]
    assert tops and set(tops) == {3}
    text = client.completions.create(model="tiny", prompt="Hello", max_tokens=6, logprobs=2)
    legacy = text.choices[0].logprobs
    # {text: logprob}: two ids that render as one text (byte pieces of a character) share an entry
    assert all(1 <= len(alts) <= 3 for alts in legacy.top_logprobs)
    assert all(max(alts.values()) >= lp - 1e-6 for alts, lp in zip(legacy.top_logprobs, legacy.token_logprobs))
    finish(gw, info)


def test_bad_requests_are_400s_at_the_gateway(gw):
    info, client = session(gw)
    for kw, param in (
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"temperature": 3.0}, "temperature"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}
                ]
            },
            "messages",
        ),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", **{"messages": MESSAGES, "max_tokens": 4, **kw})
        assert err.value.body["param"] == param
    assert all(not t.turns for t in finish(gw, info))


def test_an_agent_that_times_out_leaves_no_turn(gw, server):
    engine = server.engine
    original = engine.choose_tokens

    def slow(logits, seqs):
        time.sleep(0.01)
        return original(logits, seqs)

    engine.choose_tokens = slow
    try:
        info, _ = session(gw)
        impatient = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0, timeout=0.5)
        before = engine.stats["generated_tokens"]
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=3000, extra_body={"ignore_eos": True}
            )
        start = time.monotonic()
        while engine.batch.size and time.monotonic() - start < 2.0:
            time.sleep(0.01)
        assert time.monotonic() - start < 1.0  # the server stopped generating for nobody
        assert engine.stats["generated_tokens"] - before < 300
        assert all(not t.turns for t in finish(gw, info))
        assert httpx.get(f"{gw.url}/stats").json()["undelivered"] >= 1
    finally:
        engine.choose_tokens = original


async def test_a_reply_is_recorded_only_once_sent():
    """``Delivery``: the turns of an answer are recorded after it was sent, and given back (never
    recorded) when the agent was gone before it could be."""
    import asyncio

    from agentgym.gateway.model_calls import Delivery

    for agent_left in (False, True):
        done: list[str] = []
        sent: list[dict] = []
        delivery = Delivery(
            b"{}", "application/json", lambda done=done: done.append("record"), lambda done=done: done.append("release")
        )
        gone = asyncio.get_running_loop().create_future()
        if agent_left:
            gone.set_result(None)

        async def send(message, sent=sent):
            sent.append(message)

        async def receive():
            return {"type": "http.disconnect"}

        await delivery.deliver({"type": "http", "method": "POST", "headers": []}, receive, send, gone)
        assert done == (["release"] if agent_left else ["record"])
        assert bool(sent) is not agent_left


def test_the_vllm_request_carries_everything_and_the_embedded_server_reads_it(server):
    """vLLM's /v1/completions names (>= 0.10.2): structured_outputs (a tool call as an xgrammar
    structural tag), penalties, logit_bias with string keys, min_tokens, top logprobs as token ids.
    The embedded server takes the same body and honours all of it."""
    from agentgym.client.dialects import completion_choice, completions_payload
    from agentgym.client.structured import chat_constraint
    from agentgym.server.tool_calls import parse_tool_calls
    from agentgym.types import SamplingParams

    sampling = SamplingParams(
        max_tokens=200,
        structured=chat_constraint(TOOLS, "required", False, None),
        frequency_penalty=0.5,
        logit_bias={9: -2.0},
        min_tokens=3,
        top_logprobs=2,
    )
    body = completions_payload([5, 6, 7], sampling, "vllm")
    assert json.loads(body["structured_outputs"]["structural_tag"])["type"] == "structural_tag"
    assert body["logit_bias"] == {"9": -2.0} and body["min_tokens"] == 3 and body["frequency_penalty"] == 0.5
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    ids, logprobs, tops = completion_choice(answer["choices"][0], "embedded", 2)
    assert len(ids) == len(logprobs) == len(tops) and all(len(t) == 2 for t in tops)
    _, calls, errors = parse_tool_calls(answer["choices"][0]["text"])
    assert len(calls) == 1 and not errors


def test_n_samples_streamed_are_recorded_once_the_stream_ended(gw):
    info, client = session(gw)
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, n=2, stream=True, tools=TOOLS, tool_choice="required"
    )
    finished = {
        c.choices[0].index: c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason
    }
    assert set(finished) == {0, 1}
    trajectories = finish(gw, info)
    assert len(trajectories) == 2 and all(
        t.num_turns == 1 and t.turns[0].shaped_by == ["grammar"] for t in trajectories
    )
