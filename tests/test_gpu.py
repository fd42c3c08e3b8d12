"""The ``gpu`` lane (``pytest -m gpu``, or ``bash scripts/gpu-check.sh``): what a GPU machine adds
to the CPU suite. The embedded engine on CUDA, an FSDP2 training step on CUDA, a weight push
into a server on the same GPU, a GRPO step on the Qwen2.5-0.5B shape, checkpoints moving
between FSDP2 on CUDA and dp on the CPU, and a CPU trainer on a machine where CUDA is visible.

Without CUDA every test skips. ``AGENTGYM_GPU_LANE_DEVICE=cpu`` runs the lane's code on the CPU
instead (slowly; FSDP2 over gloo), to check the tests themselves on a machine with no GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
import torch

from agentgym.client import PolicyClient
from agentgym.model import load_causal_lm
from agentgym.types import SamplingParams
from tests.support.bench_modules import train_step_bench
from tests.support.fidelity import logprob_tolerance, max_difference, teacher_forced
from tests.trainer.test_checkpoint import _actor, _largest_difference, _resume_and_step, _step, _weights

DEVICE = os.environ.get("AGENTGYM_GPU_LANE_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA GPU visible"),
]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
async def test_embedded_engine_on_the_gpu_matches_the_trainers_logprobs(dtype):
    from agentgym.server.launch import start_embedded_server

    server = start_embedded_server("tiny", device=DEVICE, dtype=dtype)
    try:
        assert server.engine.device.type == DEVICE and str(server.engine.model.dtype) == f"torch.{dtype}"
        reference = load_causal_lm("tiny")  # float32 on the CPU: what the promise is measured against
        async with PolicyClient(server.url) as client:
            prompts = [list(range(5, 5 + k)) for k in (3, 17, 9, 30)]
            samples = await asyncio.gather(*(client.generate(p, SamplingParams(max_tokens=32)) for p in prompts))
        worst = max(
            max_difference(s.logprobs, teacher_forced(reference, p, s.token_ids)) for p, s in zip(prompts, samples)
        )
        print(f"embedded {dtype} on {DEVICE}: max logprob difference {worst:.2e}", file=sys.stderr)
        assert worst < logprob_tolerance(dtype)
    finally:
        server.stop()


def test_fsdp2_training_step_and_weight_push_into_a_server_on_the_same_gpu(tmp_path):
    """Two FSDP2 steps on the GPU move the weights; they reach an embedded server on the same
    GPU both ways the trainer pushes them (tensors in process; a /dev/shm file over HTTP), and
    the server then samples with them."""
    from agentgym.client.weights import EmbeddedWeights
    from agentgym.server.launch import start_embedded_server

    group = _actor("fsdp2", 1, DEVICE)
    server = start_embedded_server("tiny", device=DEVICE, dtype="float32")
    try:
        before = _weights(group)
        after = _step(group, seed=1)
        after = _step(group, seed=2)
        assert _largest_difference(before, after) > 1e-4
        assert server.update_weights(after, 1) == 1
        path = tmp_path / "model.safetensors"
        group.call("push_weights", str(path))
        EmbeddedWeights(admin_key=server.admin_key).update_from_disk(server.url, str(path), 2)
        trained = load_causal_lm("tiny")
        trained.load_state_dict(after)

        async def sample():
            async with PolicyClient(server.url) as client:
                return await client.generate([7, 8, 9, 10], SamplingParams(max_tokens=24))

        got = asyncio.run(sample())
        assert got.weight_version == 2
        assert max_difference(got.logprobs, teacher_forced(trained, [7, 8, 9, 10], got.token_ids)) < logprob_tolerance(
            "float32"
        )
    finally:
        server.stop()
        group.shutdown()


def test_a_cpu_trainer_on_a_gpu_machine_stays_on_the_cpu():
    """trainer.device=cpu with FSDP2 while CUDA is visible: the weights must not follow
    fully_shard's default mesh to cuda:0 ("index is on cpu, different from other tensors on cuda:0")."""
    group = _actor("fsdp2", 1, "cpu")
    try:
        before = _weights(group)
        after = _step(group, seed=1)
        assert _largest_difference(before, after) > 1e-4
    finally:
        group.shutdown()


def test_checkpoints_move_between_fsdp2_on_the_gpu_and_dp_on_the_cpu(tmp_path):
    sharded = _actor("fsdp2", 1, DEVICE)
    try:
        _step(sharded, seed=1)
        sharded.call("save_checkpoint", str(tmp_path / "gpu"))
        saved = _weights(sharded)
    finally:
        sharded.shutdown()
    loaded, stepped, plain = _resume_and_step("dp", 1, tmp_path / "gpu", seed=2, device="cpu")
    try:
        assert _largest_difference(loaded, saved) == 0.0 and _largest_difference(stepped, loaded) > 0
        plain.call("save_checkpoint", str(tmp_path / "cpu"))
    finally:
        plain.shutdown()
    loaded, _, back = _resume_and_step("fsdp2", 1, tmp_path / "cpu", seed=3, device=DEVICE)
    back.shutdown()
    assert _largest_difference(loaded, stepped) == 0.0


def test_grpo_step_on_the_qwen2_5_0_5b_shape(tmp_path):
    """One GRPO step end to end (rollout on the embedded server, FSDP2 update, weight push) on a
    random model with Qwen2.5-0.5B's shape: 2 prompts x 4 samples, up to 64 new tokens."""
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    model = train_step_bench().big_model_dir()
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"actor_rollout_ref.model.path={model}",
            f"trainer.device={DEVICE}",
            "trainer.use_ray=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.max_tokens_per_turn=64",
            "data.max_response_length=64",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={tmp_path}",
        ],
    )
    summary = train(cfg, show_progress=False)
    with open(summary["metrics_file"]) as f:
        rows = [json.loads(line) for line in f if "reward/mean" in line]
    assert len(rows) == 2 and all(r["actor/grad_norm"] == r["actor/grad_norm"] for r in rows)  # finite, not NaN
    assert [r["rollout/weight_version_lag"] for r in rows] == [0, 0]
    print(
        f"0.5B-shape GRPO step on {DEVICE}: {rows[-1]['timing_s/step']:.2f} s "
        f"(weight sync {rows[-1].get('timing_s/weight_sync', float('nan')):.2f} s)",
        file=sys.stderr,
    )
