"""Where the gateway keeps finished sessions: in memory, or durably in SQLite.

A finished session is written once, when it finishes (never per call or per token), as one
``ArchivedSession``: its identity (id, group, a hash of its API key), status, times, metadata,
a summary without token ids, its per-call records, and its trajectories as the JSON text the
finish call answers with. ``SqliteArchive`` commits it before ``put`` returns, so a session whose
finish was answered survives a crash of the gateway (``kill -9``) and is there after a restart:
``GET /sessions/<id>``, ``POST /sessions/<id>/finish`` (the same trajectories again),
``GET /sessions/<id>/calls`` and the listing read it back.

* ``MemoryArchive``: the latest ``keep`` finished sessions, in this process (the default: what a
  gateway inside the trainer's process needs, and nothing survives the process).
* ``SqliteArchive(path)``: one SQLite file in WAL mode, Python's own ``sqlite3`` on a thread of its
  own, off the event loop. Finishes that arrive together are committed together (one transaction,
  one hop to that thread), so the cost per session stays a JSON encoding and a share of a commit.
  ``synchronous=NORMAL``: a commit survives the process dying, not the machine losing power.
  The hop to the thread, not the insert, is most of a lone finish's cost (on this 2-core machine:
  about 75 us of CPU for the insert and commit, 210-270 us with the hop); ``aiosqlite`` makes the
  same hop per call (``executemany``, then ``commit``) and measured 5-10% more, so this needs no
  extra dependency.

``open_archive("memory" | "sqlite:PATH" | "PATH.sqlite")`` picks one (``agentgym gateway --store``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import sqlite3
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentgym.types import Trajectory, Turn

if TYPE_CHECKING:
    from agentgym.gateway.sessions import Session

STATUSES = ("open", "finished", "failed")


def key_hash(key: str) -> str:
    """What is stored of a session's API key: enough to check it, not to use it."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class ArchivedSession:
    """A finished session as stored. ``trajectories``: JSON text of the list of trajectories (what
    ``POST /sessions/<id>/finish`` answers with); ``summary``: ``Session.summary(with_tokens=False)``."""

    id: str
    key_hash: str
    group_id: str
    status: str  # finished | failed
    created: float
    finished: float
    metadata: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)
    trajectories: str = "[]"

    def header(self) -> dict[str, Any]:
        """The session as the listing shows it."""
        return {
            "id": self.id,
            "group_id": self.group_id,
            "status": self.status,
            "created": self.created,
            "finished_at": self.finished,
            "metadata": self.metadata,
            "requests": self.summary.get("requests", 0),
            "failure": self.summary.get("failure"),
        }


def trajectory_json(traj: Trajectory) -> dict[str, Any]:
    """``traj.to_dict()`` without its deep copy of every token id (5 ms for a few hundred tokens)."""
    out = {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}
    out["turns"] = [{f.name: getattr(t, f.name) for f in _TURN_FIELDS} for t in traj.turns]
    return out


_TURN_FIELDS = dataclasses.fields(Turn)


def archive_record(session: Session) -> ArchivedSession:
    """A finished session as the archive keeps it (its trajectories encoded once, here)."""
    return ArchivedSession(
        id=session.id,
        key_hash=key_hash(session.key),
        group_id=session.group_id,
        status=session.status,
        created=session.created,
        finished=session.finished_at or 0.0,
        metadata=session.metadata,
        summary=session.summary(with_tokens=False),
        calls=session.calls,
        trajectories=json.dumps([trajectory_json(t) for t in session.trajectories or []]),
    )


def archived_summary(record: ArchivedSession, with_tokens: bool = True) -> dict[str, Any]:
    """``Session.summary`` of an archived session (each branch's turns read back from its trajectory)."""
    out = {**record.summary, "metadata": record.metadata}
    if with_tokens:
        turns = {t["task"].get("branch"): t["turns"] for t in json.loads(record.trajectories)}
        keys = (
            "prompt_ids",
            "response_ids",
            "logprobs",
            "reward",
            "weight_version",
            "finish_reason",
            "observation",
            "response_text",
        )
        out["branches"] = [
            {**b, "turns": [{k: t.get(k) for k in keys} for t in turns.get(b["index"], [])]}
            for b in out.get("branches", [])
        ]
    return out


def finish_body(record: ArchivedSession) -> bytes:
    """``POST /sessions/<id>/finish``'s answer, around the stored trajectories' JSON (not re-encoded)."""
    head = json.dumps({"id": record.id, "group_id": record.group_id})[:-1]
    return f'{head}, "trajectories": {record.trajectories}}}'.encode()


def matches(
    header: dict[str, Any], group_id: str | None, status: str | None, since: float | None, until: float | None
) -> bool:
    """Whether a listed session passes the filters (``since``/``until``: its creation time, seconds)."""
    return (
        (group_id is None or header["group_id"] == group_id)
        and (status is None or header["status"] == status)
        and (since is None or header["created"] >= since)
        and (until is None or header["created"] < until)
    )


class Archive(Protocol):
    """The store interface. ``put`` returns once the session is as safe as the archive makes it."""

    async def start(self) -> None: ...
    async def put(self, record: ArchivedSession) -> None: ...
    async def get(self, sid: str) -> ArchivedSession | None: ...
    async def list(
        self,
        group_id: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]: ...
    async def set_metadata(self, sid: str, metadata: dict[str, Any]) -> bool: ...
    async def delete(self, sid: str) -> bool: ...
    async def close(self) -> None: ...


class MemoryArchive:
    """The latest ``keep`` finished sessions, in memory (oldest dropped first)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.records: OrderedDict[str, ArchivedSession] = OrderedDict()

    async def start(self) -> None:
        return None

    async def put(self, record: ArchivedSession) -> None:
        self.records[record.id] = record
        while len(self.records) > self.keep:
            self.records.popitem(last=False)

    async def get(self, sid: str) -> ArchivedSession | None:
        return self.records.get(sid)

    async def list(
        self,
        group_id: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        rows = [h for h in (r.header() for r in self.records.values()) if matches(h, group_id, status, since, until)]
        rows.sort(key=lambda h: h["created"])
        return rows[offset : offset + limit]

    async def set_metadata(self, sid: str, metadata: dict[str, Any]) -> bool:
        record = self.records.get(sid)
        if record is None:
            return False
        record.metadata.update(metadata)
        return True

    async def delete(self, sid: str) -> bool:
        return self.records.pop(sid, None) is not None

    async def close(self) -> None:
        return None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL,
    group_id TEXT NOT NULL,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    finished REAL NOT NULL,
    metadata TEXT NOT NULL,
    summary TEXT NOT NULL,
    calls TEXT NOT NULL,
    trajectories TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_group ON sessions(group_id, created);
CREATE INDEX IF NOT EXISTS sessions_created ON sessions(created);
"""
_COLUMNS = "id, key_hash, group_id, status, created, finished, metadata, summary, calls, trajectories"


class SqliteArchive:
    """Finished sessions in one SQLite file (see the module docstring). Concurrent ``put`` calls are
    committed as one transaction; each returns once its session is committed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._db: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[tuple[tuple[Any, ...], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False

    async def _run(self, fn: Any, *args: Any) -> Any:
        """``fn(connection, *args)`` on the archive's own thread, where every sqlite3 call is made."""
        assert self._thread is not None, "the session archive is not started (await archive.start() first)"
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, self._db, *args)

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gateway-archive")

        def connect(_: Any) -> sqlite3.Connection:
            db = sqlite3.connect(str(self.path), check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.commit()
            return db

        self._db = await self._run(connect)
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name="gateway-archive-writer")

    async def put(self, record: ArchivedSession) -> None:
        if self._wake is None:
            raise RuntimeError("the session archive is not started (await archive.start() first)")
        row = (
            record.id,
            record.key_hash,
            record.group_id,
            record.status,
            record.created,
            record.finished,
            json.dumps(record.metadata),
            json.dumps(record.summary),
            json.dumps(record.calls),
            record.trajectories,
        )
        done = asyncio.get_running_loop().create_future()
        self._pending.append((row, done))
        self._wake.set()
        await done

    @staticmethod
    def _insert(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        with db:  # one transaction
            db.executemany(f"INSERT OR REPLACE INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    async def _write_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                if self._closing:
                    return
                continue
            try:
                await self._run(self._insert, [row for row, _ in batch])
            except Exception as exc:  # every waiting finish learns it was not stored
                for _, done in batch:
                    if not done.done():
                        done.set_exception(RuntimeError(f"could not store the session in {self.path}: {exc}"))
                continue
            for _, done in batch:
                if not done.done():
                    done.set_result(None)
            self._wake.set()  # once more: what came in meanwhile, or the end when closing

    async def get(self, sid: str) -> ArchivedSession | None:
        row = await self._run(lambda db: db.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (sid,)).fetchone())
        if row is None:
            return None
        return ArchivedSession(
            id=row[0],
            key_hash=row[1],
            group_id=row[2],
            status=row[3],
            created=row[4],
            finished=row[5],
            metadata=json.loads(row[6]),
            summary=json.loads(row[7]),
            calls=json.loads(row[8]),
            trajectories=row[9],
        )

    async def list(
        self,
        group_id: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        where, args = [], []
        for clause, value in (
            ("group_id = ?", group_id),
            ("status = ?", status),
            ("created >= ?", since),
            ("created < ?", until),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = (
            "SELECT id, group_id, status, created, finished, metadata, summary FROM sessions"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY created LIMIT ? OFFSET ?"
        )
        rows = await self._run(lambda db: db.execute(sql, (*args, limit, offset)).fetchall())
        out = []
        for sid, group, status_, created, finished, metadata, summary in rows:
            brief = json.loads(summary)
            out.append(
                {
                    "id": sid,
                    "group_id": group,
                    "status": status_,
                    "created": created,
                    "finished_at": finished,
                    "metadata": json.loads(metadata),
                    "requests": brief.get("requests", 0),
                    "failure": brief.get("failure"),
                }
            )
        return out

    async def set_metadata(self, sid: str, metadata: dict[str, Any]) -> bool:
        def update(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT metadata FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                return False
            with db:
                db.execute(
                    "UPDATE sessions SET metadata = ? WHERE id = ?",
                    (json.dumps({**json.loads(row[0]), **metadata}), sid),
                )
            return True

        return await self._run(update)

    async def delete(self, sid: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with db:
                return db.execute("DELETE FROM sessions WHERE id = ?", (sid,)).rowcount > 0

        return await self._run(delete)

    async def close(self) -> None:
        if self._writer is not None and self._wake is not None:
            self._closing = True  # the writer commits what is queued, then returns
            self._wake.set()
            await self._writer
            self._writer = None
        if self._db is not None:
            await self._run(lambda db: db.close())
            self._db = None
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None


def open_archive(spec: str | None, keep: int = 10_000, worker: int | None = None) -> Archive:
    """``memory`` (or None/empty), ``sqlite:PATH`` or a path ending ``.sqlite``/``.db``. A worker of a
    multi-process gateway (``worker`` k) keeps its own file, ``<name>.w<k><suffix>``."""
    if not spec or spec == "memory":
        return MemoryArchive(keep)
    path = spec[len("sqlite:") :] if spec.startswith("sqlite:") else spec
    if not (spec.startswith("sqlite:") or path.endswith((".sqlite", ".db", ".sqlite3"))):
        raise ValueError(f"unknown session store {spec!r}: give 'memory', 'sqlite:PATH' or a PATH ending .sqlite")
    p = Path(path).expanduser()
    if worker is not None:
        p = p.with_name(f"{p.stem}.w{worker}{p.suffix}")
    return SqliteArchive(p)
