"""``agentgym gateway --workers N``: one gateway served by N processes.

One gateway process tops out at one core (0.4-0.5 ms of CPU per model call on a 2-core machine). Sessions live in
the memory of the process that created them, so the workers split the sessions, not the calls:

* the parent binds the public port and one private port per worker, starts the workers (each a
  full ``Gateway`` with its own policy client) and passes them the sockets; the kernel hands each
  new connection on the public port to one of them;
* ``POST /sessions`` is dealt round-robin over the workers (each worker takes every N-th of the
  ones it receives and forwards the others), so the sessions spread evenly even when one
  keep-alive connection creates them all; a session's id starts ``w<k>-`` and its ``base_url``
  names worker k's private port (with the host name the client used), so the agent's model
  calls go straight to the process that holds its session, with no extra hop;
* a request for another worker's session that arrives on the public port (``GET``/``reward``/
  ``finish`` from the trainer, or an agent given the public URL) is forwarded to its owner;
* ``/pause``, ``/resume``, ``/stats``, ``/health``, ``/servers`` and the listing ``GET /sessions``
  go to every worker; the answers are combined (counts summed, ``paused`` if any is, the sessions
  listed together; ``limit`` and ``offset`` apply per worker). ``/health`` is a 503 until every
  worker answers, so a client that waits for it never meets a worker that is still starting.
* with ``--store sqlite:PATH`` each worker keeps its finished sessions in a file of its own
  (``<name>.w<k><suffix>``); a restarted gateway with the same number of workers finds them again.

The parent waits on the workers: if one dies it stops the others and exits non-zero (a lost worker
is lost sessions; the trainer sees its sessions fail). A worker whose parent is gone exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from agentgym.client.http11 import ConnectionPool, TransportError
from agentgym.server.errors import error_response

LOCAL_HEADER = "x-agentgym-worker-local"  # a fanned-out request: answer it here, do not fan out again
FAN_OUT = {"/pause", "/resume", "/stats", "/health", "/servers"}
FORWARDED_HEADERS = (b"authorization", b"content-type", b"host")


def worker_of(sid: str) -> int | None:
    """The worker index in a session id ``w<k>-...`` (None for a single-process gateway's ids)."""
    if sid.startswith("w"):
        head, sep, _ = sid[1:].partition("-")
        if sep and head.isdigit():
            return int(head)
    return None


def combine(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' JSON answers as one: numbers summed (``weight_version``: the highest), flags true if
    any is, lists joined (``sessions``: by creation time; ``servers``: every worker has the same),
    anything else the first worker's."""
    out: dict[str, Any] = {}
    for key in answers[0]:
        values = [a.get(key) for a in answers]
        if key != "servers" and all(isinstance(v, list) for v in values):
            out[key] = [x for v in values for x in v]
            if key == "sessions":
                out[key].sort(key=lambda h: h.get("created") or 0)
        elif all(isinstance(v, bool) for v in values):
            out[key] = any(values)
        elif key == "weight_version":
            out[key] = max((v for v in values if isinstance(v, int)), default=None)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
        else:
            out[key] = values[0]
    out["workers"] = len(answers)
    return out


class WorkerRouter:
    """ASGI app in front of one worker's ``GatewayApp``: forwards other workers' sessions, fans out the
    gateway-wide admin calls, and passes everything else to ``app``."""

    def __init__(self, app: Any, index: int, peers: list[int], host: str = "127.0.0.1") -> None:
        self.app, self.index = app, index
        self.state = getattr(app, "state", None)
        self.peers = [ConnectionPool(host, port, limit=256) for port in peers]
        self._created = index  # sessions dealt so far (offset so the workers start on different ones)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith("/sessions/"):
                owner = worker_of(path[10:].split("/", 1)[0])
                if owner is not None and owner != self.index and owner < len(self.peers):
                    await self.forward(owner, scope, receive, send)
                    return
            elif not any(k == LOCAL_HEADER.encode() for k, _ in scope["headers"]):
                if path in FAN_OUT or (path == "/sessions" and scope["method"] == "GET"):
                    await self.fan_out(scope, receive, send)
                    return
                if path == "/sessions" and scope["method"] == "POST":
                    target = self._created % len(self.peers)
                    self._created += 1
                    if target != self.index:
                        await self.forward(target, scope, receive, send, {LOCAL_HEADER: "1"})
                        return
        await self.app(scope, receive, send)

    @staticmethod
    async def _body(receive: Any) -> bytes:
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        return b"".join(chunks)

    @staticmethod
    def _request(scope: dict[str, Any]) -> tuple[str, dict[str, str]]:
        target = scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in FORWARDED_HEADERS}
        return target, headers

    async def _call(self, k: int, scope: dict[str, Any], body: bytes, extra: dict[str, str]) -> Any:
        target, headers = self._request(scope)
        content_type = headers.pop("content-type", "application/json")
        return await self.peers[k].fetch(
            scope["method"],
            target,
            body if body or scope["method"] != "GET" else None,
            timeout=900.0,
            content_type=content_type,
            headers={**headers, **extra},
        )

    async def forward(
        self, owner: int, scope: dict[str, Any], receive: Any, send: Any, extra: dict[str, str] | None = None
    ) -> None:
        body = await self._body(receive)
        try:
            answer = await self._call(owner, scope, body, extra or {})
        except TransportError as exc:
            await error_response(
                502, f"gateway worker {owner} did not answer: {exc}", "server_error", code="worker_unavailable"
            )(scope, receive, send)
            return
        content_type = answer.header(b"content-type") or b"application/json"
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(answer.body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})

    async def fan_out(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await self._body(receive)
        try:
            answers = await asyncio.gather(
                *(self._call(k, scope, body, {LOCAL_HEADER: "1"}) for k in range(len(self.peers)))
            )
        except TransportError as exc:
            await error_response(
                503 if scope["path"] == "/health" else 502,
                f"a gateway worker did not answer: {exc}",
                "server_error",
                code="worker_unavailable",
            )(scope, receive, send)
            return
        failed = next((a for a in answers if a.status >= 400), None)
        if failed is not None:
            status, payload = failed.status, failed.body
        else:
            status, payload = 200, json.dumps(combine([json.loads(a.body) for a in answers])).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


# ---- the parent ---------------------------------------------------------------------------------
def serve_workers(
    public: socket.socket,
    workers: int,
    servers: list[str],
    backend: str,
    model: str,
    banner: str,
    options: dict[str, Any],
) -> int:
    """Start ``workers`` worker processes sharing ``public`` and supervise them until a signal or a
    worker's death. ``options``: the ``Gateway`` options (``admin_key`` goes by environment)."""
    from agentgym.client.health import wait_healthy
    from agentgym.server.handles import bind_socket

    host = public.getsockname()[0]
    private = [bind_socket(host, 0) for _ in range(workers)]
    ports = [s.getsockname()[1] for s in private]
    env = dict(os.environ)
    if options.get("admin_key"):
        env["AGENTGYM_GATEWAY_ADMIN_KEY"] = options["admin_key"]
    else:
        env.pop("AGENTGYM_GATEWAY_ADMIN_KEY", None)
    procs: list[subprocess.Popen] = []
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for k, sock in enumerate(private):
            command = [
                sys.executable,
                "-m",
                "agentgym.gateway.workers",
                "--index",
                str(k),
                "--public-fd",
                str(public.fileno()),
                "--private-fd",
                str(sock.fileno()),
                "--peers",
                ",".join(map(str, ports)),
                "--backend",
                backend,
                "--model",
                model,
                "--model-name",
                str(options.get("model_name") or model),
            ]
            if options.get("max_model_len"):
                command += ["--max-model-len", str(options["max_model_len"])]
            if options.get("store"):
                command += ["--store", str(options["store"])]
            limits = {
                k: v for k, v in options.items() if k not in ("admin_key", "model_name", "max_model_len", "store")
            }
            if limits:
                command += ["--options", json.dumps(limits)]
            for url in servers:
                command += ["--server", url]
            procs.append(subprocess.Popen(command, env=env, pass_fds=(public.fileno(), sock.fileno())))
        # a worker's /health asks every worker: when it answers 200, all of them are up
        up = wait_healthy(f"http://{host}:{ports[0]}", lambda: stopping or any(p.poll() is not None for p in procs))
        if not up and not stopping:
            raise RuntimeError("the gateway workers did not all start (see their output above)")
        print(banner, flush=True)
        while not stopping:
            dead = next((p for p in procs if p.poll() is not None), None)
            if dead is not None:
                print(
                    f"agentgym gateway: worker {procs.index(dead)} exited with code {dead.returncode}; "
                    "stopping the others (its sessions are lost)",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            time.sleep(0.2)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for sock in private:
            sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---- a worker -----------------------------------------------------------------------------------
def worker_main(argv: list[str] | None = None) -> int:
    import argparse

    from agentgym.gateway.serve import _run, serve_gateway, tune_gc_for_serving
    from agentgym.model import load_tokenizer

    parser = argparse.ArgumentParser(description="one worker process of agentgym gateway --workers N")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--public-fd", type=int, required=True)
    parser.add_argument("--private-fd", type=int, required=True)
    parser.add_argument("--peers", required=True, help="every worker's private port, in index order")
    parser.add_argument("--server", action="append", required=True)
    parser.add_argument("--backend", default="embedded")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--store", default="memory")
    parser.add_argument("--options", default="{}", help="more Gateway options, as JSON (limits)")
    args = parser.parse_args(argv)
    public = socket.socket(fileno=args.public_fd)
    private = socket.socket(fileno=args.private_fd)
    host = private.getsockname()[0]
    peers = [int(p) for p in args.peers.split(",")]
    parent = os.getppid()
    tokenizer = load_tokenizer(args.model)
    tune_gc_for_serving()

    async def main() -> None:
        async def orphaned() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(1.0)
            os._exit(0)  # the parent is gone: nobody supervises this worker any more

        watch = asyncio.create_task(orphaned())
        try:
            await serve_gateway(
                [public, private],
                args.server,
                args.backend,
                tokenizer,
                wrap=lambda app: WorkerRouter(app, args.index, peers, "127.0.0.1" if host == "0.0.0.0" else host),
                model_name=args.model_name or args.model,
                max_model_len=args.max_model_len,
                admin_key=os.environ.get("AGENTGYM_GATEWAY_ADMIN_KEY") or None,
                worker=args.index,
                worker_port=peers[args.index],
                store=args.store,
                **json.loads(args.options),
            )
        finally:
            watch.cancel()

    _run(main())
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
