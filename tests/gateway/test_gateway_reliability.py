"""The gateway under load and abuse: 1,000 concurrent agent sessions through ``agentgym gateway``
(a child process; once as one process, once with ``--workers 2``) against the stand-in policy server
(``tests/support/standin_server.py``, another
child process), which is killed and restarted mid-run. No trajectory may be lost or mixed between
sessions, and malformed requests must get OpenAI-style 4xx answers while the gateway stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import time
import uuid

import httpx
import openai
import pytest

from agentgym.gateway.client import GatewayClient
from agentgym.types import Trajectory
from tests.support.bench_modules import gateway_bench

bench = gateway_bench()

SESSIONS = 1000
OPENAI_EVERY = 10  # every 10th session talks through the openai client
CLIENTS = 50  # client-side httpx pools (one pool of 1,000 connections costs more CPU than the gateway)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


class _Chat:
    """One session's chat calls: through the ``openai`` client, or (cheaper on a small machine:
    the openai client spends milliseconds of CPU per call) as the same JSON over raw httpx."""

    def __init__(self, info: dict, http: httpx.AsyncClient, use_openai: bool) -> None:
        self.url, self.key, self.http = info["base_url"], info["api_key"], http
        self.client = (
            openai.AsyncOpenAI(base_url=self.url, api_key=self.key, http_client=http, max_retries=3)
            if use_openai
            else None
        )

    async def __call__(self, messages: list[dict]) -> dict:
        if self.client is not None:
            r = await self.client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            return r.choices[0].message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        r = await self.http.post(
            self.url + "/chat/completions",
            json={"model": "m", "messages": messages, "tools": TOOLS},
            headers={"Authorization": f"Bearer {self.key}"},
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]


async def _agent(
    i: int, nonce: str, admin: GatewayClient, http: httpx.AsyncClient, progress: list[int]
) -> tuple[str, list[Trajectory]]:
    """Three model calls with its own unique content: echo, a tool call, the final answer."""
    info = await admin.create_session(
        task={"reward_fn": "gsm8k", "ground_truth": str(i + 7), "nonce": nonce}, group_id=f"group-{i // 4}"
    )
    chat = _Chat(info, http, use_openai=i % OPENAI_EVERY == 0)
    messages = [{"role": "user", "content": f"session {i} nonce {nonce}"}]
    reply = await chat(messages)
    assert reply["content"] == f"echo: session {i} nonce {nonce}"
    progress[0] += 1
    messages += [reply, {"role": "user", "content": f"CALC: {i} + 7"}]
    reply = await chat(messages)
    [call] = reply["tool_calls"]
    assert call["function"]["arguments"] == f'{{"expression": "{i} + 7"}}'
    messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": str(i + 7)}]
    reply = await chat(messages)
    assert reply["content"] == f"The tool says {i + 7}. #### {i + 7}"
    return info["id"], await admin.finish_session(info["id"])


async def _abuse(url: str, sid: str, key: str, stop: asyncio.Event) -> list[tuple[str, int, dict]]:
    """Bad requests, sent while the load runs; returns (what, status, body) for each."""
    out = []
    auth = {"Authorization": f"Bearer {key}"}
    chat = f"{url}/sessions/{sid}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            for what, request in (
                (
                    "malformed json",
                    http.post(chat, content=b'{"messages": [', headers={**auth, "Content-Type": "application/json"}),
                ),
                (
                    "unknown session",
                    http.post(
                        f"{url}/sessions/{uuid.uuid4().hex}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "x"}]},
                        headers=auth,
                    ),
                ),
                (
                    "wrong key",
                    http.post(
                        chat,
                        json={"messages": [{"role": "user", "content": "x"}]},
                        headers={"Authorization": "Bearer sk-agentgym-forged"},
                    ),
                ),
                (
                    "oversized prompt",
                    http.post(chat, json={"messages": [{"role": "user", "content": "word " * 6000}]}, headers=auth),
                ),
                ("no messages", http.post(chat, json={"model": "m"}, headers=auth)),
            ):
                response = await request
                out.append((what, response.status_code, response.json()))
            await asyncio.sleep(0.2)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
async def test_1000_sessions_survive_a_server_restart_and_bad_requests(oracle, workers):
    started = time.monotonic()
    standin_port, gateway_port = bench.free_port(), bench.free_port()
    standin_url, url = f"http://127.0.0.1:{standin_port}", f"http://127.0.0.1:{gateway_port}"
    standin = bench.start_standin(standin_port, version=0)
    gateway = None
    try:
        gateway = bench.start_gateway_process(gateway_port, [standin_url], workers=workers)
        ready = time.monotonic()
        admin = GatewayClient(url, bench.ADMIN_KEY)
        limits = httpx.Limits(
            max_connections=SESSIONS // CLIENTS + 10, max_keepalive_connections=SESSIONS // CLIENTS + 10
        )
        tls = ssl.create_default_context()  # loaded once: each client would spend ~50 ms on its own
        https = [
            httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0, connect=30.0), verify=tls)
            for _ in range(CLIENTS)
        ]
        nonces = [uuid.uuid4().hex[:12] for _ in range(SESSIONS)]
        progress = [0]
        async with contextlib.AsyncExitStack() as stack:
            for client in https:
                await stack.enter_async_context(client)
            http = https[0]
            victim = await admin.create_session()
            stop_abuse = asyncio.Event()
            abuse = asyncio.create_task(_abuse(url, victim["id"], victim["api_key"], stop_abuse))

            async def restart() -> float:
                while progress[0] < SESSIONS // 3:
                    await asyncio.sleep(0.01)
                standin_box[0].kill()  # a crash, with requests in flight
                standin_box[0].wait()
                at = time.monotonic()
                standin_box[0] = await asyncio.to_thread(bench.start_standin, standin_port, "echo", 1)
                return time.monotonic() - at

            standin_box = [standin]
            restarter = asyncio.create_task(restart())
            results = await asyncio.gather(
                *(_agent(i, nonces[i], admin, https[i % CLIENTS], progress) for i in range(SESSIONS))
            )
            ran = time.monotonic() - ready
            downtime = await restarter
            standin = standin_box[0]
            stop_abuse.set()
            answers = await abuse
            stats = await admin.stats()
            assert (await http.get(url + "/health")).json()["status"] == "ok"
        await admin.aclose()
        assert gateway.poll() is None, "the gateway process died"
    finally:
        if gateway is not None:
            bench.stop(gateway)
        bench.stop(standin)

    # no trajectory lost, none mixed between sessions
    versions = set()
    for i, (sid, trajs) in enumerate(results):
        [traj] = trajs
        assert traj.task["session_id"] == sid and traj.task["nonce"] == nonces[i]
        assert traj.num_turns == 3 and traj.metrics["branches"] == 1 and traj.outcome_reward == 1.0
        text = oracle.tok.decode(traj.token_ids(), skip_special_tokens=False)
        assert set(re.findall(r"nonce ([0-9a-f]{12})", text)) == {nonces[i]}
        assert f"CALC: {i} + 7" in text and f"#### {i + 7}" in text
        context: list[int] = []
        for turn in traj.turns:  # exactly what the stand-in sampled for exactly this context
            context += turn.prompt_ids
            assert turn.response_ids == oracle.reply_ids(context)
            context += turn.response_ids
            versions.add(turn.weight_version)
    assert versions == {0, 1}, "the restart (weight version 0 -> 1) should fall mid-run"
    assert stats["finished"] == SESSIONS and stats["extend"] == 2 * SESSIONS

    # every bad request got an OpenAI-shaped 4xx, and each kind was tried while the load ran
    expected = {
        "malformed json": 400,
        "unknown session": 404,
        "wrong key": 401,
        "oversized prompt": 400,
        "no messages": 400,
    }
    assert {what for what, _, _ in answers} == set(expected)
    for what, status, body in answers:
        assert status == expected[what], (what, status, body)
        assert set(body["error"]) >= {"message", "type", "code"} and body["error"]["message"]
    assert any(
        body["error"]["code"] == "context_length_exceeded" for what, _, body in answers if what == "oversized prompt"
    )
    elapsed = time.monotonic() - started
    print(
        f"\n{SESSIONS} sessions, {3 * SESSIONS} model calls in {ran:.1f}s ({elapsed:.1f}s with start-up and checks, "
        f"{ready - started:.1f}s to start); stand-in down {downtime:.2f}s; "
        f"upstream retries {stats['upstream_retries']}; {len(answers)} bad requests answered"
    )
