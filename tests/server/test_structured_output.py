"""What agent frameworks lean on, against the embedded server through the official ``openai`` client:
forced tool calls and JSON output by constrained decoding (from the tiny random model: the grammar,
not the model, makes the reply valid), penalties / logit_bias / min_tokens with OpenAI's and vLLM's
semantics (checked step by step against the formulas on a teacher-forced pass), clear 400s, and a
client that gives up on a request that is not streamed stopping its generation."""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pydantic
import pytest
import torch

from tests.support.fidelity import logprob_tolerance, teacher_forced

CALC = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "op": {"enum": ["add", "sub", "mul"]},
        "exact": {"type": "boolean"},
    },
    "required": ["a", "op", "exact"],
    "additionalProperties": False,
}
LOOKUP = {
    "type": "object",
    "properties": {"key": {"type": "string", "maxLength": 6}},
    "required": ["key"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "calc", "parameters": CALC}},
    {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}},
]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def server(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


def calls_valid(message, tools=TOOLS) -> list[str]:
    """The names of the message's tool calls, each checked against its tool's schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert message.tool_calls, message
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    return [c.function.name for c in message.tool_calls]


# ---- constrained decoding ----------------------------------------------------------------------
def test_required_and_named_tool_choice_force_valid_calls(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=300,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert set(calls_valid(choice.message)) <= {"calc", "lookup"}
    for name in ("calc", "lookup"):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            tools=TOOLS,
            max_tokens=300,
            n=2,
            tool_choice={"type": "function", "function": {"name": name}},
        )
        for choice in r.choices:
            assert calls_valid(choice.message) == [name]  # exactly one call, of the named tool


def test_parallel_tool_calls_false_gives_one_call(client):
    for seed in range(4):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            seed=seed,
            max_tokens=300,
        )
        assert len(calls_valid(r.choices[0].message)) == 1


def test_response_format_json_schema_and_json_object(client):
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "minimum": -5, "maximum": 5},
            "sure": {"type": "boolean"},
            "unit": {"enum": ["m", "s"]},
        },
        "required": ["answer", "sure", "unit"],
        "additionalProperties": False,
    }
    for seed in range(3):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            seed=seed,
            max_tokens=200,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            },
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=400,
        seed=1,
        response_format={"type": "json_object"},
        logit_bias={str(t): -100 for t in range(300, 637)},
    )  # keep strings short
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_with_a_pydantic_model(client):
    class Verdict(pydantic.BaseModel):
        label: str = pydantic.Field(max_length=5)
        score: int = pydantic.Field(ge=0, le=10)
        ok: bool

    r = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Verdict, max_tokens=200, seed=3)
    assert isinstance(r.choices[0].message.parsed, Verdict)


def test_completions_take_vllm_structured_outputs(client):
    r = client.completions.create(
        model="tiny",
        prompt="Pick:",
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert r.choices[0].text in ("yes", "no", "maybe")
    r = client.completions.create(
        model="tiny", prompt="Digits:", max_tokens=20, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-c]{2}"}}
    )
    text = r.choices[0].text
    assert len(text) == 6 and text[:3].isdigit() and text[3] == "-" and set(text[4:]) <= set("abc")
    r = client.completions.create(model="tiny", prompt="JSON:", max_tokens=200, extra_body={"guided_json": CALC})
    jsonschema.validate(json.loads(r.choices[0].text), CALC)


def test_constrained_logprobs_are_the_models_own(server, client, model):
    """A grammar decides which tokens may be drawn, not what the logprobs report: they stay the
    model's own distribution, which a teacher-forced pass recomputes (the trainer's view)."""
    r = client.completions.create(
        model="tiny",
        prompt=[5, 6, 7],
        max_tokens=60,
        logprobs=0,
        frequency_penalty=1.0,
        logit_bias={"9": 5},
        extra_body={"structured_outputs": {"json": CALC}, "return_token_ids": True},
    )
    ids = extra(r.choices[0], "token_ids")
    jsonschema.validate(json.loads(r.choices[0].text), CALC)
    expected = teacher_forced(model, [5, 6, 7], ids)
    assert max(abs(a - b) for a, b in zip(r.choices[0].logprobs.token_logprobs, expected)) < logprob_tolerance(
        server.engine.model.dtype
    )


# ---- penalties, logit_bias, min_tokens ---------------------------------------------------------------
def raw_logits(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """The model's logits before each of ``ids`` (teacher-forced)."""
    with torch.no_grad():
        out = model(torch.tensor([prompt + ids])).logits[0].float()
    return out[len(prompt) - 1 : len(prompt) - 1 + len(ids)]


def assert_greedy_under(model, prompt, ids, process) -> None:
    """Every token of a greedy reply is the argmax of ``process(step, raw logits)``, the formula under test."""
    logits = raw_logits(model, prompt, ids)
    for i, token in enumerate(ids):
        processed = process(i, logits[i].clone())
        assert processed[token] >= processed.max() - 1e-3, (i, token, int(processed.argmax()))


def greedy(client, prompt, **kw) -> list[int]:
    extra_body = {"ignore_eos": True, "return_token_ids": True, **kw.pop("extra_body", {})}
    r = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=24, temperature=0, extra_body=extra_body, **kw
    )
    return extra(r.choices[0], "token_ids")


def test_frequency_and_presence_penalties_follow_openai(client, model):
    prompt = [40, 41, 42, 43]
    plain = greedy(client, prompt)
    assert len(set(plain)) < len(plain)  # the tiny model repeats itself: the penalties have work to do
    for freq, pres in ((1.5, 0.0), (0.0, 2.0), (0.7, 0.9), (-1.0, 0.0)):
        ids = greedy(client, prompt, frequency_penalty=freq, presence_penalty=pres)
        if freq > 0 or pres > 0:
            assert ids != plain

        def process(i, row, ids=ids, freq=freq, pres=pres):
            counts = torch.bincount(torch.tensor(ids[:i], dtype=torch.long), minlength=row.shape[0]).float()
            return row - freq * counts - pres * (counts > 0).float()

        assert_greedy_under(model, prompt, ids, process)


def test_repetition_penalty_follows_vllm(client, model):
    prompt = [40, 41, 42, 43]
    ids = greedy(client, prompt, extra_body={"repetition_penalty": 1.8})
    assert ids != greedy(client, prompt)

    def process(i, row):
        seen = torch.zeros(row.shape[0], dtype=torch.bool)
        seen[torch.tensor(prompt + ids[:i])] = True
        return torch.where(seen, torch.where(row > 0, row / 1.8, row * 1.8), row)

    assert_greedy_under(model, prompt, ids, process)


def test_logit_bias_is_added_before_sampling(client, model):
    prompt = [7, 8, 9]
    plain = greedy(client, prompt)
    forced = greedy(client, prompt, logit_bias={"77": 100})
    assert set(forced) == {77}
    banned = greedy(client, prompt, logit_bias={str(plain[0]): -100, str(plain[1]): -100})
    assert plain[0] not in banned and plain[1] not in banned
    bias = {plain[0]: -100.0, plain[1]: -100.0}

    def process(i, row):
        for t, b in bias.items():
            row[t] += b
        return row

    assert_greedy_under(model, prompt, banned, process)
    sampled = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=16,
        temperature=1.0,
        logit_bias={"123": 100},
        extra_body={"ignore_eos": True},
    )
    assert all(t == 123 for t in extra(sampled.choices[0], "token_ids"))
    assert greedy(client, prompt) == plain  # a bias ends with its request: none is left on the row it used


def test_min_tokens_holds_back_the_stop_tokens(server, client):
    eos = sorted(server.engine.eos_token_ids)
    bias = {str(e): 100 for e in eos}
    r = client.completions.create(
        model="tiny", prompt=[5, 6], max_tokens=20, logit_bias=bias, extra_body={"min_tokens": 5}
    )
    ids = extra(r.choices[0], "token_ids")
    assert len(ids) == 6 and ids[-1] in eos and not set(ids[:5]) & set(eos)
    assert r.choices[0].finish_reason == "stop"
    stop_at = client.completions.create(
        model="tiny",
        prompt=[5, 6],
        max_tokens=20,
        logit_bias={"99": 100},
        extra_body={"min_tokens": 3, "stop_token_ids": [99], "ignore_eos": True},
    )
    assert extra(stop_at.choices[0], "token_ids")[3:] == [99] and 99 not in extra(stop_at.choices[0], "token_ids")[:3]


# ---- 400s in OpenAI's shape --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "weather"}}}, "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"temperature": 2.5}, "temperature"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"logit_bias": {"99999": 5}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                        ],
                    }
                ]
            },
            "messages",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
            "response_format",
        ),
    ],
)
def test_bad_requests_are_400s_that_name_the_field(client, kw, param):
    kw = {"messages": MESSAGES, **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", max_tokens=4, **kw)
    assert err.value.status_code == 400
    body = err.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error" and body["message"]


# ---- cancellation ------------------------------------------------------------------------------------
def slowed(engine, seconds_per_step: float):
    """The engine's sampling made slow (restored by the caller), so a request outlives a client timeout."""
    original = engine.choose_tokens

    def slow(logits, seqs):
        time.sleep(seconds_per_step)
        return original(logits, seqs)

    engine.choose_tokens = slow
    return original


def wait_idle(engine, within: float) -> float:
    start = time.monotonic()
    while engine.batch.size and time.monotonic() - start < within:
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_client_that_times_out_stops_its_generation_within_a_second(server, endpoint):
    engine = server.engine
    impatient = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=0.5)
    original = slowed(engine, 0.01)
    try:
        before = engine.stats["generated_tokens"]
        with pytest.raises(openai.APITimeoutError):
            if endpoint == "chat":
                impatient.chat.completions.create(
                    model="tiny", messages=MESSAGES, max_tokens=3000, extra_body={"ignore_eos": True}
                )
            else:
                impatient.completions.create(
                    model="tiny", prompt=[5, 6], max_tokens=3000, extra_body={"ignore_eos": True}
                )
        assert wait_idle(engine, 2.0) < 1.0
        assert engine.stats["generated_tokens"] - before < 300  # stopped, not run to max_tokens
    finally:
        engine.choose_tokens = original


def test_the_structural_tag_sent_to_vllm_and_sglang_compiles_with_xgrammar():
    """vLLM and SGLang compile a forced tool call's structural tag with xgrammar (their default
    backend): it must accept exactly the Hermes calls. Runs where xgrammar is installed."""
    xgr = pytest.importorskip("xgrammar")
    from agentgym.client.structured import chat_constraint, structural_tag
    from agentgym.model import load_tokenizer

    tok = load_tokenizer("tiny")
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok))
    one = '<tool_call>\n{"name": "calc", "arguments": {"a": 3, "op": "add", "exact": true}}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "lookup", "arguments": {"key": "pi"}}\n</tool_call>'
    for parallel, text, accepted in (
        (True, two, True),
        (False, one, True),
        (False, two, False),
        (True, "The answer is 4.", False),
        (True, one.replace('"add"', '"pow"'), False),
    ):
        tag = structural_tag(chat_constraint(TOOLS, "required", parallel, None))
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
        assert (matcher.accept_string(text) and matcher.is_completed()) is accepted, (parallel, text)
    # tools beside response_format under auto: an "or" of the calls and the JSON
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": answer}}
    union = json.dumps(structural_tag(chat_constraint(TOOLS, "auto", True, rf)))
    for text, accepted in ((two, True), ('{"ok": true}', True), ("The answer is 4.", False), ('{"no": 1}', False)):
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(union))
        assert (matcher.accept_string(text) and matcher.is_completed()) is accepted, text


async def test_a_rows_bias_and_grammar_leave_with_its_request(server):
    """Rows are reused: what one request asked for (a bias, penalties, a grammar) must not reach the
    next request placed on its row, even when that one shares a step with another that asks for it."""
    from agentgym.server.sampling import GenerationParams

    engine = server.engine

    def greedy_params(**kw):
        return GenerationParams(max_tokens=8, temperature=0.0, ignore_eos=True, **kw)

    alone = await engine.submit([7, 8, 9], greedy_params()).done
    await engine.submit([7, 8, 9], greedy_params(logit_bias={123: 100.0}, frequency_penalty=2.0)).done
    plain, biased = (
        engine.submit([7, 8, 9], greedy_params()),
        engine.submit([7, 8, 9], greedy_params(logit_bias={200: 100.0}, repetition_penalty=2.0)),
    )
    plain_out, biased_out = (await plain.done)[0].output_ids, (await biased.done)[0].output_ids
    assert plain_out == alone[0].output_ids and set(biased_out) == {200}
