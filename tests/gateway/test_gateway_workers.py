"""``agentgym gateway --workers 2``: two worker processes behind one public port, against the
stand-in policy server (``tests/support/standin_server.py``, echo mode: every session's replies are its own).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from agentgym.gateway.client import GatewayClient
from agentgym.gateway.workers import combine, worker_of
from tests.support.bench_modules import gateway_bench

bench = gateway_bench()

ADMIN = "admin-secret"


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def standin():
    port = bench.free_port()
    proc = bench.start_standin(port, mode="echo")
    yield f"http://127.0.0.1:{port}"
    bench.stop(proc)


def _start(standin: str) -> tuple[subprocess.Popen, str]:
    port = bench.free_port()
    proc = bench.start_gateway_process(port, [standin], workers=2, env={"AGENTGYM_GATEWAY_ADMIN_KEY": ADMIN})
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def gateway(standin):
    proc, url = _start(standin)
    yield url
    bench.stop(proc)


def _chat(base_url: str, key: str, messages: list[dict]) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    return client.chat.completions.create(model="m", messages=messages, max_tokens=32).choices[0].message.content


def test_combine_sums_counts_and_ors_flags():
    out = combine(
        [
            {"sessions": 2, "paused": False, "weight_version": 3, "name": "a"},
            {"sessions": 5, "paused": True, "weight_version": 4, "name": "b"},
        ]
    )
    assert out == {"sessions": 7, "paused": True, "weight_version": 4, "name": "a", "workers": 2}
    assert worker_of("w12-abc") == 12 and worker_of("0123abcd") is None and worker_of("wx-1") is None


def test_sessions_live_on_their_worker_and_every_route_reaches_them(gateway):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(headers=admin, timeout=30) as http:  # one keep-alive connection: one worker takes them all
        infos = [http.post(f"{gateway}/sessions", json={"task": {}}).json() for _ in range(16)]
        by_name = http.post(f"{gateway.replace('127.0.0.1', 'localhost')}/sessions", json={}).json()
    owners = [worker_of(i["id"]) for i in infos]
    assert owners.count(0) == owners.count(1) == 8, "sessions are dealt round-robin over the workers"
    assert by_name["base_url"].startswith("http://localhost:"), "the base_url keeps the host name the client used"
    public_port = gateway.rsplit(":", 1)[1]
    ports = {worker_of(i["id"]): i["base_url"].split("/sessions/")[0].rsplit(":", 1)[1] for i in infos}
    assert len(set(ports.values())) == 2 and public_port not in ports.values()

    for n, info in enumerate(infos):
        first = [{"role": "user", "content": f"hello {n}"}]
        reply = _chat(info["base_url"], info["api_key"], first)  # straight to the owning worker
        assert reply == f"echo: hello {n}"
        # the same session through the public port: forwarded to its owner, and merged into its trajectory
        second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": f"again {n}"}]
        assert _chat(f"{gateway}/sessions/{info['id']}/v1", info["api_key"], second) == f"echo: again {n}"

    # another session's key is refused by the owner, whichever port the call came in on
    a, b = infos[0], next(i for i in infos if worker_of(i["id"]) != worker_of(infos[0]["id"]))
    with pytest.raises(openai.AuthenticationError):
        _chat(f"{gateway}/sessions/{a['id']}/v1", b["api_key"], [{"role": "user", "content": "x"}])
    # admin routes of a session on either worker need the admin key, also when forwarded
    assert httpx.post(f"{gateway}/sessions/{a['id']}/finish", json={}).status_code == 401
    assert httpx.post(f"{gateway}/sessions/{b['id']}/finish", json={}).status_code == 401

    stats = httpx.get(f"{gateway}/stats", headers=admin).json()
    assert stats["workers"] == 2 and stats["sessions"] >= 16 and stats["extend"] >= 16
    health = httpx.get(f"{gateway}/health").json()  # answered only once every worker is up
    assert health["status"] == "ok" and health["workers"] == 2 and health["open_sessions"] >= 16

    async def finish_all() -> list:
        client = GatewayClient(gateway, ADMIN)
        try:
            return await asyncio.gather(*(client.finish_session(i["id"], reward=float(n)) for n, i in enumerate(infos)))
        finally:
            await client.aclose()

    for n, trajectories in enumerate(asyncio.run(finish_all())):
        assert len(trajectories) == 1, "both turns extend one trajectory"
        traj = trajectories[0]
        assert traj.outcome_reward == float(n)
        assert [t.response_text for t in traj.turns] == [f"echo: hello {n}", f"echo: again {n}"], "not mixed"


def test_pause_holds_every_worker_until_resume(gateway):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    infos = []
    while {worker_of(i["id"]) for i in infos} != {0, 1}:
        infos.append(httpx.post(f"{gateway}/sessions", json={"task": {}}, headers=admin, timeout=30).json())
    paused = httpx.post(f"{gateway}/pause", json={"drain_timeout": 5}, headers=admin, timeout=30).json()
    assert paused["paused"] is True and paused["workers"] == 2
    assert httpx.get(f"{gateway}/stats", headers=admin).json()["paused"] is True

    async def calls() -> list[float]:
        async def one(info: dict) -> float:
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(
                    info["base_url"] + "/chat/completions",
                    json={"messages": [{"role": "user", "content": "wait"}]},
                    headers={"Authorization": f"Bearer {info['api_key']}"},
                )
                assert r.status_code == 200, r.text
                return time.monotonic()

        tasks = [asyncio.create_task(one(i)) for i in infos]
        await asyncio.sleep(1.0)
        assert not any(t.done() for t in tasks), "a paused worker answered"
        resumed_at = time.monotonic()
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{gateway}/resume", json={"weight_version": 7}, headers=admin)
            assert r.json() == {"paused": False, "inflight": r.json()["inflight"], "weight_version": 7, "workers": 2}
        done = await asyncio.gather(*tasks)
        return [d - resumed_at for d in done]

    assert all(d >= 0 for d in asyncio.run(calls()))
    for info in infos:
        summary = httpx.get(f"{gateway}/sessions/{info['id']}", headers=admin).json()
        assert [b["num_turns"] for b in summary["branches"]] == [1]


def test_stopping_the_parent_stops_the_workers_and_a_dead_worker_stops_the_gateway(standin):
    proc, url = _start(standin)
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    assert proc.wait(timeout=15) == 1, "a dead worker takes its sessions with it: the gateway exits non-zero"
    assert _wait_gone(workers)

    proc, url = _start(standin)
    workers = _children(proc.pid)
    bench.stop(proc)
    assert proc.returncode == 0 and _wait_gone(workers)
