"""The embedded policy server, through the real ``openai`` client.

One server on the tiny model serves the whole module (a free port, in this process). The
token-fidelity check is the one the trainer relies on: the logprobs the server reports equal
a teacher-forced forward pass of the same weights over the same token ids.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch

from agentgym.model import load_causal_lm, load_tokenizer
from agentgym.server.app import chat_message
from agentgym.server.launch import start_embedded_server
from agentgym.server.tool_calls import parse_tool_calls
from tests.support.fidelity import logprob_tolerance, teacher_forced

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def server(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.fixture
def own_server():
    """A server of its own for a test that pushes weights: the shared one keeps the tiny model's."""
    handle = start_embedded_server("tiny", port=0)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def tolerance(server) -> float:
    """The fidelity promise for the server's dtype (float32 on CPU, bfloat16 on a GPU)."""
    return logprob_tolerance(server.engine.model.dtype)


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


# ---- token path --------------------------------------------------------------------------------
async def test_concurrent_token_completions_match_teacher_forced_pass(server, model):
    """Prompts of different lengths arrive together, so they are batched with left padding
    and joined mid-flight; every sequence's logprobs must still match a lone forward pass."""
    prompts = [list(range(5, 5 + k)) for k in (3, 17, 9, 30, 1, 12)]
    before = dict(server.engine.stats)
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as aclient:

        async def one(i, prompt):
            return await aclient.completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=40 if i == 0 else 24,
                temperature=1.0,
                logprobs=0,
                extra_body={"return_token_ids": True, "ignore_eos": i % 2 == 0},
            )

        first = asyncio.create_task(one(0, prompts[0]))
        while not server.engine._seqs and not first.done():  # the rest join a running batch
            await asyncio.sleep(0.001)
        responses = await asyncio.gather(first, *(one(i, p) for i, p in enumerate(prompts) if i))
    assert server.engine.stats["prefills"] - before["prefills"] >= 2
    assert server.engine.stats["max_batch"] >= 2
    for prompt, response in zip(prompts, responses):
        choice = response.choices[0]
        ids = extra(choice, "token_ids")
        assert extra(choice, "prompt_token_ids") == prompt
        assert extra(response, "weight_version") == 0
        assert ids and len(choice.logprobs.token_logprobs) == len(ids)
        expected = teacher_forced(model, prompt, ids)
        assert max(abs(a - b) for a, b in zip(choice.logprobs.token_logprobs, expected)) < tolerance(server)
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "length":
            assert len(ids) == (40 if prompt is prompts[0] else 24)


def test_text_prompt_greedy_seed_and_stops(client, server):
    tok = load_tokenizer("tiny")
    r = client.completions.create(
        model="tiny",
        prompt="Natalia sold clips",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False},
    )
    ids = extra(r.choices[0], "token_ids")
    assert extra(r.choices[0], "prompt_token_ids") == tok.encode("Natalia sold clips")
    assert r.choices[0].text == tok.decode(ids) and r.choices[0].finish_reason == "length"
    again = client.completions.create(
        model="default",
        prompt="Natalia sold clips",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False},
    )
    assert extra(again.choices[0], "token_ids") == ids  # greedy is deterministic
    # stop_token_ids: the stop token is returned in token_ids, finish "stop"
    stop_at = client.completions.create(
        model="tiny",
        prompt="Natalia sold clips",
        max_tokens=12,
        temperature=0,
        extra_body={"stop_token_ids": [ids[3]], "ignore_eos": True},
    )
    assert extra(stop_at.choices[0], "token_ids") == ids[: ids.index(ids[3]) + 1]
    assert stop_at.choices[0].finish_reason == "stop" and extra(stop_at.choices[0], "stop_reason") == ids[3]
    # a stop string cuts the text before it
    text = tok.decode(ids)
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    cut = client.completions.create(
        model="tiny",
        prompt="Natalia sold clips",
        max_tokens=12,
        temperature=0,
        stop=[needle],
        extra_body={"ignore_eos": True, "skip_special_tokens": False},
    )
    assert cut.choices[0].finish_reason == "stop" and needle not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)
    # the same seed samples the same tokens, alone or in a batch of other requests
    kw = dict(
        model="tiny",
        prompt=[3, 4, 5],
        max_tokens=16,
        temperature=1.0,
        top_p=0.9,
        seed=1234,
        extra_body={"top_k": 50, "ignore_eos": True},
    )
    first = extra(client.completions.create(**kw).choices[0], "token_ids")
    assert extra(client.completions.create(**kw).choices[0], "token_ids") == first
    batch = client.completions.create(**{**kw, "prompt": [[3, 4, 5], [9, 9, 9, 9]]})
    assert extra(batch.choices[0], "token_ids") == first and len(batch.choices) == 2


# ---- chat --------------------------------------------------------------------------------------
def test_chat_n_logprobs_and_prompt_ids(server, client, model):
    tok = load_tokenizer("tiny")
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 48 / 2?"}]
    r = client.chat.completions.create(
        model="tiny", messages=messages, n=3, max_tokens=10, logprobs=True, top_logprobs=3, temperature=1.0
    )
    prompt = tok.encode(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    assert extra(r, "prompt_token_ids") == prompt
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == sum(len(extra(c, "token_ids")) for c in r.choices)
    for c in r.choices:
        ids = extra(c, "token_ids")
        lps = [t.logprob for t in c.logprobs.content]
        assert len(lps) == len(ids) and all(len(t.top_logprobs) == 3 for t in c.logprobs.content)
        assert max(abs(a - b) for a, b in zip(lps, teacher_forced(model, prompt, ids))) < tolerance(server)
        assert c.message.content == tok.decode(ids, skip_special_tokens=True)
        # the best alternative is at least as likely as the sampled token
        assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in c.logprobs.content)


def test_chat_streaming_matches_its_token_ids(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        n=2,
        max_tokens=12,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, ids, finish, versions, usage = ["", ""], [[], []], [None, None], set(), None
    for chunk in stream:
        versions.add(extra(chunk, "weight_version"))
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            ids[c.index] += extra(c, "token_ids") or []
            finish[c.index] = c.finish_reason or finish[c.index]
    tok = load_tokenizer("tiny")
    assert versions == {0}
    assert finish == ["length", "length"] and [len(i) for i in ids] == [12, 12]
    assert text == [tok.decode(i, skip_special_tokens=True) for i in ids]
    assert usage.completion_tokens == 24


def test_stream_raw_sse_ends_with_done(server):
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json={"prompt": [1, 2, 3], "max_tokens": 4, "stream": True, "logprobs": 0},
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" and c["weight_version"] == 0 for c in chunks)
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == len(chunks) <= 4


def test_tools_are_rendered_into_the_prompt(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "What is 48 / 2?"}], tools=TOOLS, max_tokens=4
    )
    prompt = load_tokenizer("tiny").decode(extra(r, "prompt_token_ids"))
    assert "<tools>" in prompt and '"name": "calculator"' in prompt
    none = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert "<tools>" not in load_tokenizer("tiny").decode(extra(none, "prompt_token_ids"))
    # a conversation that already holds tool calls and results renders too
    history = [
        {"role": "user", "content": "What is 48 / 2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "48 / 2"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "24"},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=4)
    assert "<tool_response>\n24\n</tool_response>" in load_tokenizer("tiny").decode(extra(r, "prompt_token_ids"))


def test_tool_call_text_becomes_openai_tool_calls():
    text = (
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    )
    message, finish = chat_message(text, "stop", parse_tools=True)
    assert finish == "tool_calls" and message.content == "Let me compute."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("calculator", {"expression": "48 / 2"}),
        ("python", {"code": "print(1)"}),
    ]
    assert len({c.id for c in message.tool_calls}) == 2
    message, finish = chat_message(text, "stop", parse_tools=False)
    assert finish == "stop" and message.content == text and not message.tool_calls
    # with no well-formed call the whole text stays the content; errors say what was wrong
    content, calls, errors = parse_tool_calls("<tool_call>{not json}</tool_call> ok")
    assert not calls and len(errors) == 1 and content == "<tool_call>{not json}</tool_call> ok"
    content, calls, errors = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {}}')
    assert not calls and "never closed" in errors[0] and content.startswith("<tool_call>")
    # a call inside <think> is reasoning, not a call
    assert parse_tool_calls('<think><tool_call>{"name": "f"}</tool_call></think>hi')[1] == []


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "nope", "prompt": "hi"}, 404, "model"),
        ({"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ({"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
        ({"prompt": "hi", "n": 0}, 400, "n"),
        ({"prompt": [1, 2, 10**9]}, 400, "prompt"),
        ({"prompt": [1] * 5000}, 400, "prompt"),
        ({"prompt": [1, 2], "max_tokens": 4095}, 400, "max_tokens"),
        ({"max_tokens": 3}, 400, "prompt"),
    ],
)
def test_bad_completion_requests_get_openai_errors(server, body, status, param):
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_malformed_json_and_bad_chat_requests(server, client):
    r = httpx.post(
        server.url + "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    for body in (
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 30, "logprobs": True},
    ):
        assert httpx.post(server.url + "/v1/chat/completions", json=body).status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert httpx.get(server.url + "/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


# ---- weights -----------------------------------------------------------------------------------
def perturbed(model, seed):
    gen = torch.Generator().manual_seed(seed)  # at 0.5 the logits reach ~30 and float32 rounding alone exceeds 1e-4
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }  # tied to the embeddings


def test_weight_update_mid_generation_keeps_one_version_per_response(own_server, model, tmp_path):
    from agentgym.model.weights import save_for_push

    server = own_server

    original = {k: v.clone() for k, v in model.state_dict().items()}
    new = perturbed(model, 1)
    path = save_for_push(new, tmp_path / "w1.safetensors")
    new_model = load_causal_lm("tiny")
    new_model.load_state_dict(new, strict=False)
    prompt = [5, 6, 7, 8]
    body = {"prompt": prompt, "max_tokens": 600, "temperature": 1.0, "logprobs": 0, "ignore_eos": True}
    result = {}

    def long_request():
        result["r"] = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 20
    while server.engine.stats["generated_tokens"] == 0 or not server.engine._seqs:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    update = httpx.post(
        server.url + "/update_weights_from_disk",
        json={"model_path": str(path), "weight_version": "1"},
        timeout=60,
        headers=admin,
    )
    thread.join(timeout=60)
    assert update.status_code == 200 and update.json() == {
        "success": True,
        "weight_version": 1,
        "message": update.json()["message"],
    }
    long = result["r"]
    ids, lps = long["choices"][0]["token_ids"], long["choices"][0]["logprobs"]["token_logprobs"]
    assert long["weight_version"] == 0 and len(ids) == 600  # started before the update: all on version 0
    assert max(abs(a - b) for a, b in zip(lps, teacher_forced(model, prompt, ids))) < tolerance(server)
    # after the update: version 1, and the new weights' logprobs
    after = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 16}).json()
    ids = after["choices"][0]["token_ids"]
    assert after["weight_version"] == 1 and httpx.get(server.url + "/weight_version").json() == {"weight_version": 1}
    lps = after["choices"][0]["logprobs"]["token_logprobs"]
    assert max(abs(a - b) for a, b in zip(lps, teacher_forced(new_model, prompt, ids))) < tolerance(server)
    assert max(abs(a - b) for a, b in zip(lps, teacher_forced(model, prompt, ids))) > 10 * tolerance(server)
    # a safetensors body works too; this one restores the original weights
    from safetensors.torch import save

    tied = {k: v for k, v in original.items() if k != "lm_head.weight"}
    r = httpx.post(
        server.url + "/update_weights_from_tensor?weight_version=2",
        content=save(tied),
        headers={**admin, "Content-Type": "application/octet-stream"},
    )
    assert r.json()["success"] and r.json()["weight_version"] == 2
    greedy = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 8}).json()
    lps = greedy["choices"][0]["logprobs"]["token_logprobs"]
    assert max(
        abs(a - b) for a, b in zip(lps, teacher_forced(model, prompt, greedy["choices"][0]["token_ids"]))
    ) < tolerance(server)
    # a bad update is refused and changes nothing
    bad = httpx.post(
        server.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")}, headers=admin
    )
    assert bad.status_code == 400 and bad.json()["success"] is False and bad.json()["weight_version"] == 2
    server.update_weights(original, 0)  # in-process handle: straight into the model
    assert httpx.get(server.url + "/weight_version").json() == {"weight_version": 0}


def test_keep_alive_requests_are_not_held_by_delayed_acks(server):
    """Without TCP_NODELAY on the server's connections every small keep-alive response waits
    ~40 ms for a delayed ACK; with it a /health round trip takes well under a millisecond."""
    with httpx.Client() as http:
        http.get(server.url + "/health")
        times = []
        for _ in range(20):
            start = time.perf_counter()
            assert http.get(server.url + "/health").status_code == 200
            times.append(time.perf_counter() - start)
    median = sorted(times)[len(times) // 2]
    assert median < 0.02, f"median /health round trip {median * 1e3:.1f} ms (delayed ACKs: ~40 ms)"


def test_pause_holds_new_requests_until_resume(server):
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    assert httpx.post(server.url + "/pause_generation", json={"mode": "wait"}, headers=admin).json()["success"]
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "r", httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 4}, timeout=30)
        )
    )
    thread.start()
    time.sleep(0.3)
    assert "r" not in result
    httpx.post(server.url + "/resume_generation", json={}, headers=admin)
    thread.join(timeout=30)
    assert result["r"].status_code == 200


def test_safetensors_files_round_trip_with_the_reference_library(tmp_path):
    import safetensors.torch as st

    from agentgym.model.weights import read_safetensors, save_for_push

    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5).bfloat16(), "c": torch.arange(7), "e": torch.empty(0, 3)}
    tied = {**tensors, "a_tied": tensors["a"]}  # shared storage is written once
    ours = st.load_file(str(save_for_push(tied, tmp_path / "ours.safetensors")))
    assert set(ours) == set(tensors) and all(torch.equal(ours[k], v) for k, v in tensors.items())
    st.save_file(tensors, str(tmp_path / "ref.safetensors"))
    back = read_safetensors(tmp_path / "ref.safetensors")
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())


# ---- a scripted model: the tool-call path end to end --------------------------------------------
SCRIPT = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n</tool_call>'


@pytest.fixture(scope="module")
def scripted():
    """The real server and engine, but the engine's next token comes from a script."""
    from agentgym.server.engine import Engine
    from agentgym.server.handles import EmbeddedServerHandle

    tok = load_tokenizer("tiny")
    script = tok.encode(SCRIPT, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]

    class ScriptedEngine(Engine):
        def choose_tokens(self, logits, seqs):
            return torch.tensor([script[min(len(s.output_ids), len(script) - 1)] for s in seqs])

    handle = EmbeddedServerHandle(ScriptedEngine(load_causal_lm("tiny"), tok, model_name="tiny").start())
    yield SimpleNamespace(
        handle=handle, script=script, client=openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
    )
    handle.stop()


def test_generated_tool_calls_come_back_as_openai_tool_calls(scripted):
    messages = [{"role": "user", "content": "What is 48 / 2?"}]
    r = scripted.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
    [call] = choice.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "48 / 2"}
    assert extra(choice, "token_ids") == scripted.script  # the eos that ended it included
    # without tools the text is just text
    plain = scripted.client.chat.completions.create(model="tiny", messages=messages, max_tokens=100)
    assert plain.choices[0].finish_reason == "stop" and plain.choices[0].message.content == SCRIPT
    assert not plain.choices[0].message.tool_calls


def test_streamed_tool_calls_and_stop_strings(scripted):
    stream = scripted.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=100, stream=True
    )
    content, calls, finish = "", [], None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert "<tool_call>" not in content and content.strip() == "Let me compute."
    assert finish == "tool_calls" and [c.function.name for c in calls] == ["calculator"]
    assert json.loads(calls[0].function.arguments) == {"expression": "48 / 2"} and calls[0].index == 0
    # a stop string is never streamed, even in part, and the text ends before it
    stream = scripted.client.completions.create(
        model="tiny", prompt=[1, 2, 3], max_tokens=100, stop=["calculator"], stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == SCRIPT[: SCRIPT.index("calculator")]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("fail_at", [0, 2], ids=["prefill", "decode"])
def test_an_engine_failure_is_a_500_and_the_server_stays_up(fail_at):
    from agentgym.server.engine import Engine
    from agentgym.server.handles import EmbeddedServerHandle

    class FlakyEngine(Engine):
        calls = 0

        def choose_tokens(self, logits, seqs):
            self.calls += 1
            if self.calls == fail_at + 1:
                raise RuntimeError("out of memory (simulated)")
            return super().choose_tokens(logits, seqs)

    handle = EmbeddedServerHandle(FlakyEngine(load_causal_lm("tiny"), load_tokenizer("tiny")).start())
    try:
        r = httpx.post(handle.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 500 and "out of memory (simulated)" in r.json()["error"]["message"]
        r = httpx.post(handle.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) >= 1
    finally:
        handle.stop()


def test_sampling_follows_the_distribution_and_the_filters():
    from agentgym.server.sampling import GenerationParams, sample_tokens

    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    rows = 20_000
    logits = probs.log().repeat(rows, 1)
    gen = torch.Generator().manual_seed(0)

    def freq(**params) -> list[float]:
        tokens = sample_tokens(logits, [GenerationParams(max_tokens=1, **params)] * rows, [None] * rows, gen)
        return (torch.bincount(tokens, minlength=4) / rows).tolist()

    for got, want in (
        (freq(), [0.5, 0.0, 0.3, 0.2]),
        (freq(top_k=2), [0.625, 0.0, 0.375, 0.0]),
        (freq(top_p=0.6), [0.625, 0.0, 0.375, 0.0]),
        (freq(temperature=0.0), [1.0, 0.0, 0.0, 0.0]),
    ):
        assert got[1] == 0.0, "a token of probability 0 was sampled"
        assert got == pytest.approx(want, abs=0.015)

    # a seeded row samples the same tokens alone or beside others
    def seeded(batch: int) -> list[int]:
        own = torch.Generator().manual_seed(7)
        out = []
        for _ in range(20):
            gens = [own] + [None] * (batch - 1)
            out.append(int(sample_tokens(logits[:batch], [GenerationParams(max_tokens=1)] * batch, gens, gen)[0]))
        return out

    assert seeded(1) == seeded(8)
