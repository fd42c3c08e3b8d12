"""agentgym's SGLang dialect against a stand-in that follows SGLang's HTTP API field by field
(tests/support/sglang_standin.py): token-level generation, finish reasons, weight versions, weight
pushes, pause/continue, and a rollout whose trajectories hold exactly what the server sampled.
No SGLang build runs on this kind of machine (docs/deploy.md, "SGLang"), so this is its check."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from agentgym.client import PolicyClient, PolicyServerError
from agentgym.client.weights import SGLangWeights
from agentgym.model import load_tokenizer
from agentgym.model.weights import save_for_push
from agentgym.rollout import RolloutConfig, RolloutRunner
from agentgym.types import SamplingParams
from tests.support.sglang_standin import EOS, REPLY, SGLangStandin, logprob


@pytest.fixture
def sglang(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    save_for_push({"model.norm.weight": torch.zeros(4)}, tmp_path / "model" / "model.safetensors")
    standin = SGLangStandin(model_path=str(tmp_path / "model"))
    standin.start()
    yield standin
    standin.stop()


def generations(standin):
    return [body for path, body in standin.calls if path == "/generate"]


async def test_generate_sends_what_sglang_accepts_and_reads_its_answer(sglang):
    prompt = [5, 6, 7]
    async with PolicyClient(sglang.url, backend="sglang", max_retries=0) as client:
        sample = await client.generate(prompt, SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, seed=3))
        assert sample.token_ids == [*REPLY, EOS]  # the stop token is kept (no_stop_trim): it is trained on
        assert sample.logprobs == [logprob(j, t, 0) for j, t in enumerate(sample.token_ids)]
        assert sample.finish_reason == "stop" and sample.weight_version == 0  # SGLang's "default" version
        body = generations(sglang)[-1]
        assert body["input_ids"] == prompt and body["return_logprob"] is True
        assert body["sampling_params"]["no_stop_trim"] is True and body["sampling_params"]["sampling_seed"] == 3
        short = await client.generate(prompt, SamplingParams(max_tokens=4))
        assert short.token_ids == REPLY[:4] and short.finish_reason == "length"
        greedy = await client.generate(prompt, SamplingParams(max_tokens=4, temperature=0.0))
        assert greedy.token_ids == REPLY[:4]


async def test_top_k_off_is_spelled_as_sglang_wants(sglang):
    """OpenAI/vLLM callers say 0 for 'no top-k'; SGLang's verify() refuses anything but -1 or >= 1."""
    async with PolicyClient(sglang.url, backend="sglang", max_retries=0) as client:
        for top_k in (0, -1, 5):
            sample = await client.generate([1, 2], SamplingParams(max_tokens=2, top_k=top_k))
            assert sample.token_ids == REPLY[:2]
        assert [b["sampling_params"]["top_k"] for b in generations(sglang)] == [-1, -1, 5]
    with pytest.raises(PolicyServerError, match="top_k must be -1"):  # the stand-in checks as SGLang does
        async with PolicyClient(sglang.url, backend="sglang", max_retries=0) as client:
            await client._post("/generate", {"input_ids": [1], "sampling_params": {"top_k": 0}})


async def test_weight_push_reaches_sglang_as_a_model_directory_and_versions_the_samples(sglang, tmp_path):
    weights = SGLangWeights(model_dir=tmp_path / "model")
    state = {"model.norm.weight": torch.ones(4)}
    async with PolicyClient(sglang.url, backend="sglang", max_retries=0) as client:
        weights.update_from_state_dict(sglang.url, state, 1)  # a state dict, through shared memory
        single = save_for_push(state, tmp_path / "pushed.safetensors")
        weights.update_from_disk(sglang.url, str(single), 2)  # one file, as the trainer writes it
        assert sglang.loads == 2 and sglang.weight_version == "2"
        sample = await client.generate([1, 2, 3], SamplingParams(max_tokens=3))
        assert sample.weight_version == 2 and sample.logprobs == [logprob(j, t, 2) for j, t in enumerate(REPLY[:3])]
        await client.update_weights_from_disk(str(tmp_path / "model"), 3)  # the client's own route
        sample = await client.generate([1, 2, 3], SamplingParams(max_tokens=3))
        assert sample.weight_version == 3
    bad = [body for path, body in sglang.calls if path == "/update_weights_from_disk"]
    assert all(isinstance(b["weight_version"], str) for b in bad)  # SGLang's field is a string
    with pytest.raises(Exception, match="config.json"):  # a directory SGLang cannot load is refused
        SGLangWeights().update_from_state_dict(sglang.url, state, 4)
    assert sglang.weight_version == "3"


async def test_pause_aborts_in_flight_requests_and_holds_new_ones(sglang):
    weights = SGLangWeights()
    sglang.generation_s = 10.0  # long enough to be caught by the pause
    async with PolicyClient(sglang.url, backend="sglang", max_retries=0) as client:
        running = asyncio.create_task(client.generate([1], SamplingParams(max_tokens=4)))
        while not sglang._inflight:
            await asyncio.sleep(0.001)
        await asyncio.to_thread(weights.pause, sglang.url)  # mode abort
        aborted = await running
        assert aborted.finish_reason == "abort" and aborted.token_ids == []
        held = asyncio.create_task(client.generate([1], SamplingParams(max_tokens=4)))
        await asyncio.sleep(0.1)
        assert not held.done()
        sglang.generation_s = 0.01
        await asyncio.to_thread(weights.resume, sglang.url)
        assert (await held).token_ids == REPLY[:4]
    with pytest.raises(Exception, match="Invalid mode"):
        weights.pause(sglang.url, mode="drain")


async def test_rollout_through_sglang_is_token_exact(sglang):
    tok = load_tokenizer("tiny")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    answer = tok.encode("<answer>Up</answer>", add_special_tokens=False)
    sglang.eos = eos
    sglang.reply = lambda input_ids: [*answer, eos]
    config = RolloutConfig(n=2, max_turns=2, max_tokens=32, max_concurrency=4)
    async with PolicyClient(sglang.url, backend="sglang") as client:
        runner = RolloutRunner("sokoban", client, "tiny", config)
        result = await runner.run(tasks=2)
        await runner.aclose()
    bodies = generations(sglang)
    assert len(result.trajectories) == 4 and all(t.status != "failed" for t in result.trajectories)
    for traj in result.trajectories:
        sent: list[int] = []
        for turn in traj.turns:
            sent += turn.prompt_ids
            assert any(b["input_ids"] == sent for b in bodies)  # exactly what SGLang saw on this turn
            assert turn.response_ids == [*answer, eos]
            assert turn.logprobs == [logprob(j, t, 0) for j, t in enumerate(turn.response_ids)]
            sent += turn.response_ids
        assert traj.token_ids() == sent and traj.metrics["template_mismatch"] == 0.0


async def test_structured_output_and_penalties_are_sent_in_sglangs_names(sglang):
    """Forced tool calls as an xgrammar structural tag, JSON as json_schema, and penalties, logit_bias and
    min_tokens under SGLang's names: the stand-in refuses any sampling field SGLang does not have."""
    from agentgym.client.structured import chat_constraint

    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    async with PolicyClient(sglang.url, backend="sglang", max_retries=0) as client:
        await client.generate(
            [1, 2],
            SamplingParams(
                max_tokens=4,
                structured=chat_constraint(tools, "required", False, None),
                frequency_penalty=0.5,
                presence_penalty=0.25,
                repetition_penalty=1.1,
                logit_bias={7: -3.0},
                min_tokens=2,
                top_logprobs=2,
            ),
        )
        await client.generate(
            [1, 2], SamplingParams(max_tokens=4, structured={"type": "json", "schema": {"type": "object"}})
        )
    tagged, schema = generations(sglang)[-2:]
    params = tagged["sampling_params"]
    tag = json.loads(params["structural_tag"])
    assert tag["format"]["type"] == "tags_with_separator" and tag["format"]["stop_after_first"] is True
    assert tag["format"]["tags"][0]["begin"].startswith('<tool_call>\n{"name": "calc"')
    assert params["frequency_penalty"] == 0.5 and params["presence_penalty"] == 0.25
    assert params["repetition_penalty"] == 1.1 and params["logit_bias"] == {"7": -3.0}
    assert params["min_new_tokens"] == 2 and tagged["top_logprobs_num"] == 2
    assert json.loads(schema["sampling_params"]["json_schema"]) == {"type": "object"}
