"""The embedded policy server under hostile or unlucky input (issue 16, "Policy server").

Every malformed request gets an OpenAI-shaped 4xx and leaves the requests beside it alone; long
prompts and client templates never stall ``/health``; bodies, prompts and client templates are
bounded; the weight and pause routes need the admin key and a JSON body; a pause ends by itself;
agentgym's own weight pushes carry the key. ``benchmarks/fuzz_server.py`` runs here on a few
hundred cases.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from agentgym.server.launch import start_embedded_server
from agentgym.server.limits import ServerLimits
from tests.support.bench_modules import fuzz_server

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    handle = start_embedded_server("tiny", port=0)
    yield handle
    handle.stop()


def post_raw(url: str, raw: bytes, headers: dict | None = None, timeout: float = 60) -> httpx.Response:
    return httpx.post(url, content=raw, headers=headers or JSON, timeout=timeout)


def assert_openai_4xx(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["message"] and error["type"]


# ---- malformed requests -------------------------------------------------------------------------
BAD_BODIES = {
    "5000-digit integer": ("/v1/completions", b'{"prompt": [1, 2], "max_tokens": ' + b"9" * 5000 + b"}"),
    "deeply nested JSON": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": ' + b"[" * 50_000 + b"]" * 50_000 + b"}]}",
    ),
    "nested 200 deep": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "tools": ' + b"[" * 200 + b"]" * 200 + b"}",
    ),
    "top_k 1e30 as an integer": (
        "/v1/completions",
        b'{"prompt": [1, 2], "max_tokens": 4, "top_k": 1' + b"0" * 30 + b"}",
    ),
    "text part holding a number": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
    ),
    "lone surrogate (completions)": ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}'),
    "lone surrogate (chat)": ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}'),
    "NaN temperature": ("/v1/completions", b'{"prompt": [1, 2], "temperature": NaN}'),
    "tool call that is a string": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "assistant", "content": "", "tool_calls": ["x"]}]}',
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_malformed_requests_get_an_openai_4xx(server, case):
    path, raw = BAD_BODIES[case]
    assert_openai_4xx(post_raw(server.url + path, raw))
    assert httpx.get(server.url + "/health").status_code == 200


async def test_a_bad_request_never_fails_the_requests_beside_it(server):
    """top_k=10**30 used to overflow inside the engine and fail every sequence prefilled with it."""
    bad = b'{"prompt": [1, 2], "max_tokens": 8, "top_k": 1' + b"0" * 30 + b"}"
    good = {"prompt": [3, 4, 5], "max_tokens": 24, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(2):
            calls = [http.post(server.url + "/v1/completions", json=good) for _ in range(14)]
            calls[7:7] = [http.post(server.url + "/v1/completions", content=bad, headers=JSON)]
            answers = await asyncio.gather(*calls)
            assert_openai_4xx(answers.pop(7))
            assert [r.status_code for r in answers] == [200] * 14, [r.text[:200] for r in answers]


def test_fuzzed_requests_never_get_a_5xx(server):
    """A few hundred cases of ``benchmarks/fuzz_server.py`` (the benchmark runs thousands)."""
    tally = asyncio.run(fuzz_server().fuzz(server.url, server.admin_key, cases=250, seed=16, concurrency=6))
    print(tally.summary())
    assert tally.five_xx == 0 and not tally.server_errors, tally.server_errors
    assert not tally.neighbour_failures, tally.neighbour_failures
    assert not tally.no_answer, tally.no_answer[:5]


# ---- nothing stalls /health ---------------------------------------------------------------------
def assert_health_stays_fast(latencies: list[float]) -> None:
    """The target is /health under 100 ms whatever one request does. On a shared 2-core machine the OS
    alone can stall a process now and then, so: no round trip near a second (blocked, it took the
    request's whole 3-25 s), and nine in ten under 100 ms."""
    ordered = sorted(latencies)
    worst, p90 = ordered[-1], ordered[int(0.9 * (len(ordered) - 1))]
    print(f"/health during the request: {len(ordered)} round trips, p90 {p90 * 1e3:.0f} ms, max {worst * 1e3:.0f} ms")
    assert worst < 1.0, f"/health was blocked for {worst:.1f} s"
    assert p90 < 0.1, f"/health p90 {p90 * 1e3:.0f} ms"


def health_latencies_during(url: str, request: callable) -> tuple[list[float], httpx.Response]:
    """``/health`` round trips (s) measured while ``request()`` runs in another thread."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", request()))
    thread.start()
    time.sleep(0.2)
    latencies = []
    with httpx.Client(timeout=120) as http:
        while thread.is_alive():
            start = time.perf_counter()
            assert http.get(url + "/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
    thread.join()
    return latencies, result["r"]


@pytest.fixture(scope="module")
def open_server():
    """Limits opened up, so the slow paths are actually taken."""
    handle = start_embedded_server(
        "tiny",
        port=0,
        limits=ServerLimits(max_prompt_chars=10**9, allow_client_chat_template=True, max_body_bytes=64 << 20),
    )
    yield handle
    handle.stop()


def test_health_answers_while_a_long_prompt_is_tokenized(open_server):
    """A 1.2 MB prompt takes the tokenizer seconds: that must happen off the event loop
    (a 10 MB one blocked /health for 24.5 s)."""
    body = {"prompt": "hello world " * 100_000, "max_tokens": 2}
    started = time.perf_counter()
    latencies, r = health_latencies_during(
        open_server.url, lambda: httpx.post(open_server.url + "/v1/completions", json=body, timeout=300)
    )
    assert_health_stays_fast(latencies)
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    assert time.perf_counter() - started > 0.5 and len(latencies) >= 3, "the request was too quick to tell"


def test_health_answers_while_a_client_template_renders(open_server):
    template = "{% for i in range(100000) %}{% for j in range(8) %}x{% endfor %}{% endfor %}"
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "chat_template_kwargs": {"chat_template": template},
    }
    latencies, r = health_latencies_during(
        open_server.url, lambda: httpx.post(open_server.url + "/v1/chat/completions", json=body, timeout=300)
    )
    assert_health_stays_fast(latencies)
    assert r.status_code == 400 and len(latencies) >= 3


# ---- limits ------------------------------------------------------------------------------------------
def test_a_10MB_prompt_is_refused_at_once(server):
    started = time.perf_counter()
    r = httpx.post(
        server.url + "/v1/completions", json={"prompt": "hello world " * 900_000, "max_tokens": 2}, timeout=120
    )
    assert_openai_4xx(r)
    assert "characters" in r.json()["error"]["message"]
    assert time.perf_counter() - started < 5.0


def test_a_body_over_the_limit_is_a_413():
    with start_embedded_server("tiny", port=0, limits=ServerLimits(max_body_bytes=100_000)) as small:
        r = httpx.post(small.url + "/v1/completions", json={"prompt": [1] * 50_000, "max_tokens": 2})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        chunked = httpx.post(
            small.url + "/v1/completions", headers=JSON, content=iter([b'{"prompt": "', b"x" * 120_000, b'"}'])
        )
        assert chunked.status_code == 413
        assert httpx.post(small.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}).status_code == 200


def test_client_chat_templates_are_refused_unless_enabled(server):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "chat_template_kwargs": {"chat_template": "{{ messages[0].content }}"},
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert_openai_4xx(r)
    assert "allow-client-chat-template" in r.json()["error"]["message"]
    # template variables are still fine
    ok = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    assert httpx.post(server.url + "/v1/chat/completions", json=ok).status_code == 200


# ---- control routes -------------------------------------------------------------------------------
CONTROL = [
    ("/pause_generation", {"mode": "wait"}),
    ("/resume_generation", {}),
    ("/continue_generation", {}),
    ("/update_weights_from_disk", {"model_path": "/nonexistent"}),
]


@pytest.mark.parametrize("path,body", CONTROL)
def test_control_routes_need_the_admin_key_and_json(server, path, body):
    key = server.admin_key
    assert key
    assert httpx.post(server.url + path, json=body).status_code == 401
    assert httpx.post(server.url + path, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    plain = httpx.post(
        server.url + path,
        content=json.dumps(body),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "text/plain"},
    )
    assert plain.status_code == 415
    allowed = httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"})
    assert allowed.status_code == (400 if "update" in path else 200)
    httpx.post(server.url + "/resume_generation", json={}, headers={"Authorization": f"Bearer {key}"})


def test_a_weight_upload_needs_the_key(server):
    r = httpx.post(
        server.url + "/update_weights_from_tensor",
        content=b"x" * 64,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 401


def test_a_pause_nobody_resumes_ends_by_itself():
    with start_embedded_server("tiny", port=0, limits=ServerLimits(max_pause_s=1.0)) as paused:
        headers = {"Authorization": f"Bearer {paused.admin_key}"}
        assert httpx.post(paused.url + "/pause_generation", json={"mode": "wait"}, headers=headers).status_code == 200
        started = time.perf_counter()
        r = httpx.post(paused.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=20)
        assert r.status_code == 200
        assert 0.5 < time.perf_counter() - started < 10


# ---- agentgym's own callers still push weights ---------------------------------------------------
async def test_policy_client_pushes_weights_with_the_key(server, tmp_path):
    from agentgym.client import PolicyClient, PolicyServerError
    from agentgym.model import load_causal_lm
    from agentgym.model.weights import save_for_push

    path = save_for_push(load_causal_lm("tiny").state_dict(), tmp_path / "model.safetensors")
    async with server.client() as client:
        await client.update_weights_from_disk(str(path), 7)
    assert httpx.get(server.url + "/weight_version").json() == {"weight_version": 7}
    async with PolicyClient(server.url, admin_key=None) as keyless:
        with pytest.raises(PolicyServerError) as refused:
            await keyless.update_weights_from_disk(str(path), 8)
    assert refused.value.refused == 401
    server.update_weights(str(path), 0)


def test_a_server_in_a_child_process_gets_a_key_its_handle_uses(tmp_path):
    from agentgym.model import load_causal_lm

    with start_embedded_server("tiny", port=0, in_process=False) as child:
        assert child.admin_key
        assert httpx.post(child.url + "/pause_generation", json={}).status_code == 401
        assert child.update_weights(load_causal_lm("tiny").state_dict(), 3) == 3
        assert httpx.get(child.url + "/weight_version").json() == {"weight_version": 3}
