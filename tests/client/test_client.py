"""PolicyClient against two embedded servers, a dead port and a stand-in that answers 500."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agentgym.client import PolicyClient, PolicyServerError
from agentgym.client.versions import record_weight_version
from agentgym.model import load_causal_lm
from agentgym.server.handles import AppThread, free_port
from agentgym.server.launch import start_embedded_server
from agentgym.types import SamplingParams
from tests.support.fidelity import logprob_tolerance, max_difference, teacher_forced

ADMIN = "sk-test-admin"  # both servers take it, so one client can push weights to both


@pytest.fixture(scope="module")
def servers():
    handles = [start_embedded_server("tiny", admin_key=ADMIN), start_embedded_server("tiny", admin_key=ADMIN)]
    yield handles
    for h in handles:
        h.stop()


def requests_seen(handles):
    return [h.engine.stats["requests"] for h in handles]


async def test_generate_returns_the_sampled_tokens_and_their_logprobs(servers):
    model = load_causal_lm("tiny")
    prompt = [7, 8, 9, 10]
    async with PolicyClient(servers[0].url, model="tiny") as client:
        sample = await client.generate(prompt, SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=3))
        again = await client.generate(prompt, SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=3))
        assert await client.health() == [True]
    assert sample.token_ids == again.token_ids and len(sample.logprobs) == len(sample.token_ids)
    assert sample.finish_reason in ("stop", "length") and sample.weight_version == 0
    expected = teacher_forced(model, prompt, sample.token_ids)
    assert max_difference(sample.logprobs, expected) < logprob_tolerance(servers[0].engine.model.dtype)


async def test_least_outstanding_spreads_and_sessions_stick(servers):
    async with PolicyClient([h.url for h in servers], model="tiny", admin_key=ADMIN) as client:
        before = requests_seen(servers)
        await asyncio.gather(*(client.generate([1, 2, 3], SamplingParams(max_tokens=8)) for _ in range(16)))
        after = requests_seen(servers)
        assert [a - b for a, b in zip(after, before)] == [8, 8]  # all in flight at once: split evenly
        for session in ("s1", "s2", "s3", "s4"):
            before = requests_seen(servers)
            for turn in range(3):
                await client.generate([1, 2, 3 + turn], SamplingParams(max_tokens=4), session_id=session)
            grew = sorted(a - b for a, b in zip(requests_seen(servers), before))
            assert grew == [0, 3], "every turn of a session goes to the server that served its first"
        # weight updates reach every server
        state = {k: v for k, v in load_causal_lm("tiny").state_dict().items() if k != "lm_head.weight"}
        from agentgym.model.weights import save_for_push

        path = save_for_push(state)
        try:
            await client.update_weights_from_disk(str(path), 5)
        finally:
            path.unlink()
        assert [h.engine.weight_version for h in servers] == [5, 5]
        assert (await client.generate([1, 2], SamplingParams(max_tokens=2))).weight_version == 5


async def test_dead_server_fails_over_then_raises():
    dead = f"http://127.0.0.1:{free_port()}"
    async with PolicyClient(dead, max_retries=2, backoff=0.01) as client:
        with pytest.raises(PolicyServerError, match="failed after 3 attempts"):
            await client.generate([1, 2, 3])
        assert await client.health() == [False]


async def test_5xx_is_retried_a_bounded_number_of_times_and_4xx_is_not(servers):
    hits = {"n": 0}
    app = FastAPI()

    @app.post("/v1/completions")
    async def broken() -> JSONResponse:
        hits["n"] += 1
        return JSONResponse({"error": {"message": "boom"}}, status_code=500 if hits["n"] < 100 else 400)

    stand_in = AppThread(app)
    try:
        async with PolicyClient(stand_in.url, max_retries=2, backoff=0.01) as client:
            with pytest.raises(PolicyServerError, match="HTTP 500") as failed:
                await client.generate([1, 2, 3])
            assert hits["n"] == 3 and failed.value.refused is None
            hits["n"] = 100
            with pytest.raises(PolicyServerError, match="refused the request") as refused:
                await client.generate([1, 2, 3])
            assert hits["n"] == 101 and refused.value.refused == 400
        # with a healthy server beside it, the failing one is passed over and the request succeeds
        async with PolicyClient([stand_in.url, servers[0].url], max_retries=2, backoff=0.01) as client:
            hits["n"] = 0
            samples = await asyncio.gather(*(client.generate([1, 2], SamplingParams(max_tokens=2)) for _ in range(4)))
            assert all(s.token_ids for s in samples)
    finally:
        stand_in.stop()


async def test_vllm_backend_weight_updates_go_through_the_worker_extension():
    calls = []
    app = FastAPI()

    @app.post("/{path:path}")
    async def record(path: str) -> JSONResponse:
        calls.append("/" + path)
        return JSONResponse({"success": True})

    stand_in = AppThread(app)
    try:
        async with PolicyClient(stand_in.url, backend="vllm", model="m") as client:
            await client.update_weights_from_disk("/dev/shm/w.safetensors", 4)
            assert client.servers[0].version == 4
    finally:
        stand_in.stop()
    assert calls == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]


async def test_connections_are_capped_and_reused():
    """40 concurrent requests with max_connections=10: at most 10 reach the server at once, over
    10 keep-alive connections that are all reused by the next 40."""
    state = {"now": 0, "peak": 0}
    app = FastAPI()

    @app.post("/v1/completions")
    async def slow() -> JSONResponse:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        return JSONResponse(
            {"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [-0.1]}, "finish_reason": "stop"}]}
        )

    stand_in = AppThread(app)
    try:
        async with PolicyClient(stand_in.url, max_connections=10) as client:
            for _ in range(2):
                samples = await asyncio.gather(*(client.generate([1, 2], session_id=f"s{i}") for i in range(40)))
                assert [s.token_ids for s in samples] == [[5]] * 40
            pool = client.servers[0].transport
            assert state["peak"] == 10
            assert pool.opened == 10 and len(pool.idle) == 10
    finally:
        stand_in.stop()


async def test_max_model_len_is_the_smallest_any_server_reports(servers):
    """Embedded servers report their context in /v1/models; a server that is down says nothing."""
    short = start_embedded_server("tiny", max_model_len=512)
    try:
        assert servers[0].engine.max_model_len > 512
        urls = [servers[0].url, short.url, f"http://127.0.0.1:{free_port()}"]
        async with PolicyClient(urls) as client:
            assert await client.max_model_len() == 512
    finally:
        short.stop()
    async with PolicyClient(f"http://127.0.0.1:{free_port()}") as client:
        assert await client.max_model_len() is None


# ---- servers that answer like vLLM ----------------------------------------------------------------
@pytest.fixture
def vllm_like():
    """Serves its model under the model's path, as vLLM does unless started with
    --served-model-name: any other name is a 404. Completions carry no weight version; the
    weight routes of vLLM's dev mode answer (and are recorded)."""
    served = "/models/qwen-0.5b"
    seen: dict[str, list] = {"models": [], "weights": []}
    app = FastAPI()

    def check(body: dict) -> JSONResponse | None:
        seen["models"].append(body.get("model"))
        if body.get("model") not in (None, served):
            return JSONResponse(
                {
                    "error": {
                        "message": f"The model `{body['model']}` does not exist.",
                        "type": "NotFoundError",
                        "code": 404,
                    }
                },
                status_code=404,
            )
        return None

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": served, "object": "model", "root": served}]})

    @app.post("/v1/completions")
    async def completions(body: dict) -> JSONResponse:
        return check(body) or JSONResponse(
            {
                "choices": [
                    {"token_ids": [7, 8], "finish_reason": "length", "logprobs": {"token_logprobs": [-0.5, -0.25]}}
                ]
            }
        )

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> JSONResponse:
        return check(body) or JSONResponse(
            {
                "model": served,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            }
        )

    @app.post("/{route:path}")
    async def weights(route: str) -> JSONResponse:
        seen["weights"].append("/" + route)
        return JSONResponse({"success": True})

    server = AppThread(app)
    record_weight_version(server.url, 0)  # a server just started holds its first weights (as handles record)
    yield SimpleNamespace(url=server.url, served=served, seen=seen)
    server.stop()


async def test_requests_name_the_model_the_server_serves(vllm_like):
    """vLLM answers 404 to a model name it does not serve: the client asks /v1/models once and
    sends that name (never a fixed one); a name the caller gives is sent as given."""
    async with PolicyClient(vllm_like.url, backend="vllm", max_retries=0) as client:
        for _ in range(3):
            assert (await client.generate([1, 2], SamplingParams(max_tokens=2))).token_ids == [7, 8]
        chat = await client.chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat["choices"][0]["message"]["content"] == "hi"
    assert vllm_like.seen["models"] == [vllm_like.served] * 4
    async with PolicyClient(vllm_like.url, backend="vllm", model="other", max_retries=0) as client:
        with pytest.raises(PolicyServerError, match="404"):
            await client.generate([1, 2], SamplingParams(max_tokens=2))


async def test_weight_versions_follow_pushes_to_servers_that_do_not_report_them(vllm_like, tmp_path):
    """vLLM's completions carry no weight version: a successful push records it for the server,
    and every sample from it (through any client of this process) reports it."""
    from agentgym.client.weights import VLLMWeights

    async with PolicyClient(vllm_like.url, backend="vllm") as client:
        assert (await client.generate([1], SamplingParams(max_tokens=2))).weight_version == 0
        await asyncio.to_thread(VLLMWeights().update_from_disk, vllm_like.url, str(tmp_path), 3)
        assert (await client.generate([1], SamplingParams(max_tokens=2))).weight_version == 3
        await client.update_weights_from_disk(str(tmp_path), 4)
        assert (await client.generate([1], SamplingParams(max_tokens=2))).weight_version == 4
    async with PolicyClient(vllm_like.url + "/", backend="vllm") as other:  # a client made later
        assert (await other.generate([1], SamplingParams(max_tokens=2))).weight_version == 4
    assert vllm_like.seen["weights"].count("/collective_rpc") == 2
