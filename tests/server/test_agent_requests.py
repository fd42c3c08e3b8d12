"""What agent frameworks send that the plain chat path got wrong, against the embedded server through the
official ``openai`` client: tools beside ``response_format`` under ``tool_choice="auto"`` (a tool call OR
the JSON, by one union grammar), the legacy ``functions`` / ``function_call``, a forced call cut by
``max_tokens``, and a path the server does not serve. The tiny model's choice between a call and the JSON is
made deterministic with ``logit_bias`` on the ``<tool_call>`` token; the grammar makes the rest valid."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from agentgym.client.structured import chat_constraint
from agentgym.server.grammar import Grammars
from agentgym.server.tool_calls import assistant_reply, cut_tool_call

ARGS = {
    "type": "object",
    "properties": {"key": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["key"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": ARGS}},
    {
        "type": "function",
        "function": {
            "name": "list_keys",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
MESSAGES = [{"role": "user", "content": "Find key 7, then answer."}]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": 7}}\n</tool_call>'


@pytest.fixture(scope="module")
def server(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def tool_call_bias(server):
    """``logit_bias`` entries on the ``<tool_call>`` token: +100 picks the call, -100 the JSON."""
    token = server.engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    return lambda value: {str(token): value}


# ---- the union grammar ------------------------------------------------------------------------------
def test_the_union_grammar_accepts_a_tool_call_or_the_json_and_nothing_else(server):
    tok = server.engine.tokenizer
    grammars = Grammars(tok, server.engine.vocab_size, sorted(server.engine.eos_token_ids))
    union = grammars.text(chat_constraint(TOOLS, "auto", True, RESPONSE_FORMAT))
    grammars.check(union)

    def accepts(text: str) -> bool:
        matcher = grammars.matcher(union)
        return bool(matcher.consume_tokens(tok.encode(text, add_special_tokens=False))) and matcher.is_accepting()

    assert accepts(CALL) and accepts('{"ok": true, "n": 3}')
    assert accepts(CALL + '\n<tool_call>\n{"name": "list_keys", "arguments": {}}\n</tool_call>')  # parallel
    for refused in (
        "The answer is 3.",
        '{"ok": true}',  # the JSON must match response_format's schema
        '{"ok": true, "n": 3}' + CALL,  # one or the other, not both
        CALL.replace('"key": 7', '"key": "seven"'),  # the call's arguments match its tool's schema
        CALL.replace("lookup", "delete_all"),
    ):
        assert not accepts(refused), refused


def test_tool_choice_decides_between_the_tools_and_response_format():
    union = chat_constraint(TOOLS, "auto", None, RESPONSE_FORMAT)
    assert union["type"] == "tool_calls" and union["or_json"] == ANSWER
    assert chat_constraint(TOOLS, None, None, RESPONSE_FORMAT) == union  # no tool_choice is auto
    for forced in ("required", {"type": "function", "function": {"name": "lookup"}}):
        assert "or_json" not in chat_constraint(TOOLS, forced, None, RESPONSE_FORMAT)  # the tools win
    assert chat_constraint(TOOLS, "none", None, RESPONSE_FORMAT) == {"type": "json", "schema": ANSWER}


def test_auto_with_response_format_gives_a_tool_call_or_the_json(client, tool_call_bias):
    kw = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "response_format": RESPONSE_FORMAT, "max_tokens": 120}
    kw["parallel_tool_calls"] = False  # one call: it always ends well within max_tokens
    called = client.chat.completions.create(logit_bias=tool_call_bias(100), **kw)
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    answered = client.chat.completions.create(logit_bias=tool_call_bias(-100), **kw)
    assert answered.choices[0].finish_reason == "stop" and not answered.choices[0].message.tool_calls
    jsonschema.validate(json.loads(answered.choices[0].message.content), ANSWER)
    # tool_choice="none": the JSON only, even when the model is pushed to the call
    none = client.chat.completions.create(tool_choice="none", logit_bias=tool_call_bias(100), **kw)
    jsonschema.validate(json.loads(none.choices[0].message.content), ANSWER)
    # required beside response_format: the tools win, even when the model is pushed away from the call
    required = client.chat.completions.create(tool_choice="required", logit_bias=tool_call_bias(-100), **kw)
    assert required.choices[0].finish_reason == "tool_calls" and required.choices[0].message.tool_calls


def test_the_union_streams_a_tool_call(client, tool_call_bias):
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        response_format=RESPONSE_FORMAT,
        logit_bias=tool_call_bias(100),
        parallel_tool_calls=False,
        max_tokens=120,
        stream=True,
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    calls = [t for c in chunks for t in c.delta.tool_calls or []]
    assert calls and chunks[-1].finish_reason == "tool_calls"
    assert not "".join(c.delta.content or "" for c in chunks)


# ---- legacy functions ---------------------------------------------------------------------------------
FUNCTIONS = [t["function"] for t in TOOLS]


def test_legacy_functions_round_trip(client):
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, functions=FUNCTIONS, function_call={"name": "lookup"}, max_tokens=120
    )
    choice = r.choices[0]
    assert choice.finish_reason == "function_call" and not choice.message.tool_calls
    call = choice.message.function_call
    assert call.name == "lookup"
    jsonschema.validate(json.loads(call.arguments), ARGS)  # constrained decoding, as a named tool_choice
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "function_call": {"name": call.name, "arguments": call.arguments}},
        {"role": "function", "name": "lookup", "content": "found: 42"},
    ]
    after = client.chat.completions.create(
        model="tiny",
        messages=history,
        functions=FUNCTIONS,
        function_call="none",
        max_tokens=8,
        extra_body={"return_token_ids": True},
    )
    assert after.choices[0].finish_reason in ("stop", "length") and after.choices[0].message.function_call is None
    # the history was read: the function's result is in the prompt the server rendered
    prompt = client.chat.completions.create(
        model="tiny", messages=history, functions=FUNCTIONS, max_tokens=1, extra_body={"return_token_ids": True}
    ).model_extra["prompt_token_ids"]
    from agentgym.model import load_tokenizer

    rendered = load_tokenizer("tiny").decode(prompt)
    assert "found: 42" in rendered and '"name": "lookup"' in rendered and "<tools>" in rendered


def test_a_legacy_call_streams_as_function_call(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        functions=FUNCTIONS,
        function_call={"name": "lookup"},
        max_tokens=120,
        stream=True,
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    calls = [c.delta.function_call for c in chunks if c.delta.function_call]
    assert len(calls) == 1 and calls[0].name == "lookup" and chunks[-1].finish_reason == "function_call"
    jsonschema.validate(json.loads(calls[0].arguments), ARGS)
    assert not any(c.delta.tool_calls for c in chunks)


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"functions": FUNCTIONS, "tools": TOOLS}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"functions": FUNCTIONS, "function_call": {"name": "nope"}}, "function_call"),
        ({"functions": [{"name": "f", "parameters": [1]}], "function_call": {"name": "f"}}, "functions"),
        ({"functions": FUNCTIONS, "function_call": "required"}, "function_call"),
        ({"functions": [{"description": "no name"}]}, "functions"),
    ],
)
def test_bad_legacy_requests_are_400s(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **kw)
    body = err.value.body
    assert body["param"] == param and body["message"]
    if "tools" not in kw:  # the answer speaks the words the client used
        assert "tool" not in body["message"], body["message"]


# ---- a forced call cut by max_tokens --------------------------------------------------------------------
NOTE = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 60, "maxLength": 80}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
}


def test_a_forced_call_cut_by_max_tokens_comes_back_as_a_call(server, client):
    named = {"type": "function", "function": {"name": "note"}}
    tok = server.engine.tokenizer
    for max_tokens in (4, 40):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            tools=[*TOOLS, NOTE],
            tool_choice=named,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        choice = r.choices[0]
        assert choice.finish_reason == "length" and not choice.message.content
        [call] = choice.message.tool_calls
        assert call.function.name == "note"
        # the arguments are exactly what the model wrote of them before it ran out of tokens
        written = tok.decode(choice.model_extra["token_ids"], skip_special_tokens=False)
        assert "</tool_call>" not in written
        assert call.function.arguments == (written.split('"arguments": ', 1)[1] if '"arguments": ' in written else "")
    assert call.function.arguments  # at 40 tokens the arguments have begun
    # streamed (greedy: the same tokens), the call comes in the last chunk with the same arguments
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=[*TOOLS, NOTE],
        tool_choice=named,
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    calls = [t for c in chunks for t in c.delta.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("note", call.function.arguments)]
    assert chunks[-1].finish_reason == "length" and not "".join(c.delta.content or "" for c in chunks)


def test_cut_calls_are_parsed_from_the_text():
    assert cut_tool_call('<tool_call>\n{"name": "lookup", "arguments": {"key": 4')[1]["function"] == {
        "name": "lookup",
        "arguments": '{"key": 4',
    }
    head, call = cut_tool_call('say <tool_call>\n{"name": "look', forced=["lookup", "list_keys"])
    assert head == "say " and call["function"] == {"name": "lookup", "arguments": ""}
    assert cut_tool_call('<tool_call>\n{"name": "l', forced=["lookup", "list_keys"])[1] is None  # either
    assert cut_tool_call('<tool_call>\n{"name": "look')[1] is None  # not forced: the name is unknown
    assert cut_tool_call('<think><tool_call>\n{"name": "lookup", "arguments": {')[1] is None  # reasoning
    content, calls, finish = assistant_reply(CALL + "\n" + CALL[:40], "length", True)
    assert content is None and len(calls) == 2 and finish == "length"
    assert assistant_reply(CALL[:40], "stop", True)[1] == []  # only a reply that ran out of tokens is cut


# ---- unserved paths ----------------------------------------------------------------------------------
def test_an_unserved_path_names_the_api_and_what_it_serves(server, client):
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="tiny", input="hi")  # no embeddings API here
    message = err.value.body["message"]
    assert "agentgym" in message and "POST /v1/chat/completions" in message and "docs/openai_api.md" in message
    assert err.value.body["code"] == "unknown_url"
    wrong_method = httpx.get(server.url + "/v1/chat/completions")
    assert wrong_method.status_code == 405 and "takes POST" in wrong_method.json()["error"]["message"]


def test_routes_added_later_win_and_are_listed():
    """Other APIs (/v1/responses, /v1/messages) are added by their own modules after the handlers are
    installed: the unknown-path answer must neither shadow them nor forget them."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from agentgym.server.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app, what="agentgym's test app")

    @app.post("/v1/responses")
    async def responses() -> dict:
        return {"served": True}

    with TestClient(app) as http:
        assert http.post("/v1/responses").json() == {"served": True}
        missing = http.post("/v1/messages")
        assert missing.status_code == 404 and "POST /v1/responses" in missing.json()["error"]["message"]
