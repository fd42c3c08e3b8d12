"""``agentgym rollout --sampling-seed`` against vLLM: never the request vLLM's CPU backend dies on.

vLLM-CPU kills its engine on a seeded request whose prompt is prefilled in more than one step
(``agentgym/client/vllm_cpu.py``). The stand-in (``tests/support/vllm_standin.py``) dies the same way;
its step here is 32 tokens, so every Sokoban prompt would be split.
"""

from __future__ import annotations

import pytest

from agentgym.cli import main
from agentgym.model import load_tokenizer
from tests.support.vllm_standin import VLLMStandin

TOK = load_tokenizer("tiny")
REPLY = TOK.encode("<answer>Up</answer><|im_end|>", add_special_tokens=False)


@pytest.fixture
def standin(request):
    server = VLLMStandin(REPLY, max_num_batched_tokens=32, **getattr(request, "param", {}))
    server.start()
    yield server
    server.stop()


def rollout(url: str, *extra: str) -> int:
    return main(
        [
            "rollout",
            "--env",
            "sokoban",
            "--server",
            url,
            "--backend",
            "vllm",
            "-n",
            "2",
            "--tasks",
            "2",
            "--max-turns",
            "2",
            "--env-executor",
            "inline",
            *extra,
        ]
    )


def generations(server: VLLMStandin) -> list[dict]:
    return [body for path, body in server.requests if path == "/v1/completions"]


@pytest.mark.parametrize(
    "standin", [{"dev_mode": True}, {"dev_mode": False}], indirect=True, ids=["cpu-chunked", "does-not-say"]
)
def test_seeded_rollout_sends_no_request_vllm_cpu_dies_on(standin, capsys):
    assert rollout(standin.url, "--sampling-seed", "7") == 0
    bodies = generations(standin)
    assert len(bodies) >= 4 and all(len(b["prompt"]) > standin.max_num_batched_tokens for b in bodies)
    assert not [b for b in bodies if standin.crashes_on(b)] and standin.dead is None
    assert all("seed" not in b for b in bodies)
    assert "failed" not in capsys.readouterr().err


@pytest.mark.parametrize("standin", [{"chunked_prefill": False}, {"device": "cuda"}], indirect=True)
def test_seeds_still_reach_a_vllm_they_cannot_crash(standin):
    """Without chunked prefill (agentgym's launcher's choice on a CPU), or on a GPU, sampling stays reproducible."""
    assert rollout(standin.url, "--sampling-seed", "7") == 0
    seeds = [b.get("seed") for b in generations(standin)]
    assert len(seeds) >= 4 and all(isinstance(s, int) for s in seeds) and len(set(seeds)) == len(seeds)
