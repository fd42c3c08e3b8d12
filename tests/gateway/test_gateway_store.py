"""Where finished sessions live (``agentgym.gateway.archive``) and the query API over them.

* A gateway process with ``--store sqlite:PATH`` is killed with SIGKILL while sessions are finished
  but not yet collected (and others are still open); restarted on the same file, it still has
  every finished session: listed, with the same trajectories, per-call records and metadata.
* The query API on an in-process gateway: list by group / status / time, metadata, per-call records,
  delete, and who may use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from agentgym.gateway import start_gateway
from agentgym.gateway.archive import ArchivedSession, MemoryArchive, SqliteArchive, open_archive
from tests.support.bench_modules import gateway_bench

bench = gateway_bench()
ADMIN = {"Authorization": f"Bearer {bench.ADMIN_KEY}"}  # the key of the gateways bench starts


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="module")
def standin():
    port = bench.free_port()
    proc = bench.start_standin(port, mode="echo", version=2)
    yield f"http://127.0.0.1:{port}"
    bench.stop(proc)


def _chat(info: dict, text: str) -> dict:
    r = httpx.post(
        info["base_url"] + "/chat/completions",
        headers={"Authorization": f"Bearer {info['api_key']}"},
        json={"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 24},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


# ---- the archives themselves ------------------------------------------------------------------------
def _record(i: int, group: str = "g") -> ArchivedSession:
    return ArchivedSession(
        id=f"s{i}",
        key_hash="h",
        group_id=group,
        status="failed" if i % 5 == 0 else "finished",
        created=1000.0 + i,
        finished=2000.0 + i,
        metadata={"i": i},
        summary={"requests": i},
        calls=[{"index": 0}],
        trajectories=json.dumps([{"turns": [], "i": i}]),
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_archive_keeps_lists_and_forgets(kind, tmp_path):
    archive = open_archive("memory" if kind == "memory" else f"sqlite:{tmp_path}/a.sqlite")
    assert isinstance(archive, MemoryArchive if kind == "memory" else SqliteArchive)
    await archive.start()
    await asyncio.gather(*(archive.put(_record(i, "even" if i % 2 == 0 else "odd")) for i in range(20)))
    assert [h["id"] for h in await archive.list(group_id="odd", limit=3)] == ["s1", "s3", "s5"]
    assert {h["id"] for h in await archive.list(status="failed")} == {"s0", "s5", "s10", "s15"}
    assert [h["id"] for h in await archive.list(since=1017.0)] == ["s17", "s18", "s19"]
    assert [h["id"] for h in await archive.list(until=1002.0, offset=1)] == ["s1"]
    got = await archive.get("s7")
    assert got is not None and json.loads(got.trajectories) == [{"turns": [], "i": 7}] and got.calls == [{"index": 0}]
    assert await archive.set_metadata("s7", {"note": "x"}) and (await archive.get("s7")).metadata == {
        "i": 7,
        "note": "x",
    }
    assert await archive.delete("s7") and await archive.get("s7") is None and not await archive.delete("s7")
    assert not await archive.set_metadata("nope", {})
    await archive.close()
    if kind == "sqlite":  # everything committed is there for the next process
        again = open_archive(f"sqlite:{tmp_path}/a.sqlite")
        await again.start()
        assert len(await again.list(limit=100)) == 19 and (await again.get("s8")).metadata == {"i": 8}
        await again.close()


def test_open_archive_names_what_it_takes(tmp_path):
    assert isinstance(open_archive(None), MemoryArchive)
    assert open_archive(str(tmp_path / "x.sqlite"), worker=3).path.name == "x.w3.sqlite"
    with pytest.raises(ValueError, match="memory.*sqlite:PATH"):
        open_archive("redis://somewhere")


# ---- kill -9 and restart ------------------------------------------------------------------------------
def test_finished_sessions_survive_kill_9(standin, tmp_path):
    store = ["--store", f"sqlite:{tmp_path}/sessions.sqlite"]
    port = bench.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = bench.start_gateway_process(port, [standin], extra=store)
    finished: dict[str, dict] = {}
    try:
        infos = [
            httpx.post(url + "/sessions", json={"group_id": f"g{i % 3}", "metadata": {"n": i}}, headers=ADMIN).json()
            for i in range(12)
        ]
        for i, info in enumerate(infos):
            _chat(info, f"session {i} first")
            _chat(info, f"session {i} second")  # a fresh branch: each call sends only its own message
        for info in infos[:9]:  # the agents finish their sessions with their own keys; nobody collected them
            r = httpx.post(
                f"{url}/sessions/{info['id']}/finish",
                json={"reward": 1.0},
                headers={"Authorization": f"Bearer {info['api_key']}"},
            )
            assert r.status_code == 200, r.text
            finished[info["id"]] = r.json()
        r = httpx.post(f"{url}/sessions/{infos[0]['id']}/metadata", json={"metadata": {"checked": True}}, headers=ADMIN)
        assert r.status_code == 200, r.text
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    proc = bench.start_gateway_process(port, [standin], extra=store)
    try:
        listed = httpx.get(url + "/sessions", params={"status": "finished"}, headers=ADMIN).json()["sessions"]
        assert sorted(h["id"] for h in listed) == sorted(finished)
        assert all(h["finished_at"] >= h["created"] for h in listed)
        for sid, before in finished.items():
            after = httpx.post(f"{url}/sessions/{sid}/finish", json={}, headers=ADMIN).json()
            assert after == before  # the same trajectories, token for token
            calls = httpx.get(f"{url}/sessions/{sid}/calls", headers=ADMIN).json()["calls"]
            assert [c["request"]["messages"][-1]["content"].split()[-1] for c in calls] == ["first", "second"]
            summary = httpx.get(f"{url}/sessions/{sid}", headers=ADMIN).json()
            assert summary["status"] == "finished" and len(summary["branches"]) == 2
            assert (
                summary["branches"][0]["turns"][0]["response_ids"]
                == before["trajectories"][0]["turns"][0]["response_ids"]
            )
        first = infos[0]["id"]
        assert httpx.get(f"{url}/sessions/{first}", headers=ADMIN).json()["metadata"] == {"n": 0, "checked": True}
        by_group = httpx.get(url + "/sessions", params={"group_id": "g1"}, headers=ADMIN).json()["sessions"]
        assert [h["id"] for h in by_group] == [infos[i]["id"] for i in (1, 4, 7)]
        # the sessions that were open when it died are gone, and say so
        assert httpx.get(f"{url}/sessions/{infos[10]['id']}", headers=ADMIN).status_code == 404
        # an agent's key still opens its own finished session; another's does not
        own = httpx.get(
            f"{url}/sessions/{infos[2]['id']}/calls", headers={"Authorization": f"Bearer {infos[2]['api_key']}"}
        )
        other = httpx.get(
            f"{url}/sessions/{infos[2]['id']}/calls", headers={"Authorization": f"Bearer {infos[3]['api_key']}"}
        )
        assert own.status_code == 200 and other.status_code == 401
        assert httpx.delete(f"{url}/sessions/{first}", headers=ADMIN).json() == {"id": first, "deleted": True}
        assert httpx.get(f"{url}/sessions/{first}", headers=ADMIN).status_code == 404
    finally:
        bench.stop(proc)


# ---- the query API ---------------------------------------------------------------------------------
def test_query_api_lists_annotates_records_and_deletes(standin):
    with start_gateway([standin], model="tiny", admin_key="sk-admin") as gw:
        admin = {"Authorization": "Bearer sk-admin"}

        def create(**body):
            r = httpx.post(gw.url + "/sessions", json=body, headers=admin)
            assert r.status_code == 200, r.text
            return r.json()

        t0 = time.time()
        a = create(group_id="A", metadata={"task": 1})
        b = create(group_id="A")
        c = create(group_id="B")
        reply = _chat(a, "hello there")
        _chat(b, "hi")
        httpx.post(f"{gw.url}/sessions/{b['id']}/finish", json={"failure": "the agent crashed"}, headers=admin)
        httpx.post(f"{gw.url}/sessions/{a['id']}/finish", json={}, headers=admin)

        def listed(**params):
            r = httpx.get(gw.url + "/sessions", params=params, headers=admin)
            assert r.status_code == 200, r.text
            return [h["id"] for h in r.json()["sessions"]]

        assert listed() == [a["id"], b["id"], c["id"]]
        assert listed(group_id="A") == [a["id"], b["id"]]
        assert listed(status="open") == [c["id"]] and listed(status="failed") == [b["id"]]
        assert listed(status="finished") == [a["id"]]
        assert listed(since=t0 - 60, until=t0 - 1) == [] and listed(limit=1, offset=1) == [b["id"]]
        assert httpx.get(gw.url + "/sessions", params={"status": "done"}, headers=admin).status_code == 400
        assert httpx.get(gw.url + "/sessions").status_code == 401  # the admin key guards the listing

        r = httpx.post(f"{gw.url}/sessions/{c['id']}/metadata", json={"metadata": {"seed": 7}}, headers=admin)
        assert r.json() == {"id": c["id"], "metadata": {"seed": 7}}
        r = httpx.post(f"{gw.url}/sessions/{a['id']}/metadata", json={"metadata": {"label": "ok"}}, headers=admin)
        assert r.json()["metadata"] == {"task": 1, "label": "ok"}
        assert (
            httpx.post(f"{gw.url}/sessions/{a['id']}/metadata", json={"metadata": 3}, headers=admin).status_code == 400
        )

        [call] = httpx.get(f"{gw.url}/sessions/{a['id']}/calls", headers=admin).json()["calls"]
        assert call["request"]["messages"] == [{"role": "user", "content": "hello there"}]
        assert call["responses"][0]["content"] == reply["choices"][0]["message"]["content"] == "echo: hello there"
        assert call["prompt_tokens"] == reply["usage"]["prompt_tokens"]
        assert call["completion_tokens"] == [reply["usage"]["completion_tokens"]]
        assert call["latency_ms"] > 0 and call["weight_version"] == 2 and call["plan"] == "fresh"
        assert call["sampling"]["max_tokens"] == 24
        # the session's own key reads its calls; another session's key is refused
        own = httpx.get(f"{gw.url}/sessions/{c['id']}/calls", headers={"Authorization": f"Bearer {c['api_key']}"})
        other = httpx.get(f"{gw.url}/sessions/{c['id']}/calls", headers={"Authorization": f"Bearer {a['api_key']}"})
        assert own.json()["calls"] == [] and other.status_code in (401, 403)

        assert httpx.delete(f"{gw.url}/sessions/{c['id']}", headers=admin).json()["deleted"]
        assert httpx.post(
            c["base_url"] + "/chat/completions",
            headers={"Authorization": f"Bearer {c['api_key']}"},
            json={"messages": [{"role": "user", "content": "x"}]},
        ).status_code in (401, 404)
        assert listed() == [a["id"], b["id"]]


async def test_the_admin_client_speaks_the_query_api(standin):
    with start_gateway([standin], model="tiny") as gw:
        client = gw.client()
        info = await client.create_session(group_id="q", metadata={"a": 1})
        await asyncio.to_thread(_chat, info, "hi")
        assert [s["id"] for s in await client.list_sessions(group_id="q", status="open")] == [info["id"]]
        assert await client.set_metadata(info["id"], {"b": 2}) == {"a": 1, "b": 2}
        [call] = await client.calls(info["id"])
        assert call["responses"][0]["content"] == "echo: hi"
        [traj] = await client.finish_session(info["id"])
        assert traj.group_id == "q" and [s["id"] for s in await client.list_sessions(status="finished")] == [info["id"]]
        assert [s["url"] for s in await client.servers()] == [standin]
        await client.delete_session(info["id"])
        assert await client.list_sessions() == []
        await client.aclose()


@pytest.mark.slow
def test_workers_keep_their_own_files_and_list_together(standin, tmp_path):
    store = ["--store", f"sqlite:{tmp_path}/s.sqlite"]
    port = bench.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = bench.start_gateway_process(port, [standin], workers=2, extra=store)
    try:
        infos = [httpx.post(url + "/sessions", json={"group_id": "w"}, headers=ADMIN).json() for _ in range(4)]
        assert {i["id"][:3] for i in infos} == {"w0-", "w1-"}
        for i, info in enumerate(infos):
            _chat(info, f"worker session {i}")
            assert httpx.post(f"{url}/sessions/{info['id']}/finish", json={}, headers=ADMIN).status_code == 200
        assert len(httpx.get(url + "/sessions", headers=ADMIN).json()["sessions"]) == 4
    finally:
        workers = _children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the parent: its workers notice and exit
        proc.wait()
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        for w in workers:  # reap nothing (not our children); just wait for them to be gone
            with contextlib.suppress(OSError):
                if Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    workers = [x for x in workers if x != w]
        time.sleep(0.1)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".sqlite") == ["s.w0.sqlite", "s.w1.sqlite"]
    proc = bench.start_gateway_process(port, [standin], workers=2, extra=store)
    try:
        listed = httpx.get(url + "/sessions", params={"status": "finished"}, headers=ADMIN).json()["sessions"]
        assert sorted(h["id"] for h in listed) == sorted(i["id"] for i in infos)
        for info in infos:  # the public port forwards each to its own worker, which reads its own file
            assert len(httpx.get(f"{url}/sessions/{info['id']}/calls", headers=ADMIN).json()["calls"]) == 1
    finally:
        bench.stop(proc)
