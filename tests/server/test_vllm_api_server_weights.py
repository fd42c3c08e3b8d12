"""agentgym's vLLM weight path end to end on CPU, against the vLLM stand-in (tests/support/vllm_api_server:
vLLM's command line and dev-mode weight routes in front of agentgym's server). A state dict pushed through
the handle ``start_engine_server("vllm")`` returns goes the way it goes to a real vLLM: a safetensors file
in ``/dev/shm``, ``/pause``, ``/collective_rpc`` with ``agentgym_load_weights`` (agentgym's worker
extension reads the file and calls the model's ``load_weights``), ``/resume``. The server then samples
from exactly those weights, and the client reports the pushed version though vLLM's answers carry none.
(The multinode lane runs the same server on another "host", placed by Ray.)"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch

from agentgym.client import PolicyClient
from agentgym.model import load_causal_lm
from agentgym.server.launch import start_embedded_server
from agentgym.server.launchers import start_engine_server
from agentgym.types import SamplingParams

STANDIN = Path(__file__).resolve().parents[1] / "support" / "vllm_api_server"


async def _greedy(url: str, backend: str) -> tuple[list[int], list[float], int]:
    async with PolicyClient(url, backend=backend) as client:
        sample = await client.generate([1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0))
    return sample.token_ids, sample.logprobs, sample.weight_version


@pytest.mark.slow
def test_a_pushed_state_dict_reaches_a_vllm_server_through_the_worker_extension(tmp_path, monkeypatch):
    python = tmp_path / "vllm-python"  # an interpreter that imports the stand-in as `vllm`
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{STANDIN}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("AGENTGYM_VLLM_PYTHON", str(python))
    model = load_causal_lm("tiny")
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    state = dict(model.state_dict())
    server = start_engine_server("vllm", "tiny", timeout=300)
    reference = start_embedded_server("tiny")  # in this process: the same engine on the pushed weights
    try:
        before = asyncio.run(_greedy(server.url, "vllm"))
        server.update_weights(state, 5)
        reference.update_weights(state, 5)
        ids, logprobs, version = asyncio.run(_greedy(server.url, "vllm"))
        want_ids, want_logprobs, _ = asyncio.run(_greedy(reference.url, "embedded"))
    finally:
        server.stop()
        reference.stop()
    assert before[0] != ids  # the push changed what it samples
    assert ids == want_ids and torch.allclose(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-4)
    assert version == 5
