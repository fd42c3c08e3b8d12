"""The handles code and tests hold on running policy servers, whatever engine runs them.

Every server is a ``PolicyServerHandle``: ``.url`` (base URL, no ``/v1``), ``.backend``
(``embedded`` | ``vllm`` | ``sglang``, the ``PolicyClient`` dialect), ``.model`` (the name it
answers to), ``.update_weights(path_or_state, version)`` and ``.stop()``; it is also a context
manager. ``EmbeddedServerHandle`` serves an engine of this process from a uvicorn thread
(``AppThread``); ``SubprocessServerHandle`` runs any server command in its own process group.

A server in a child process never outlives this one by accident: ``stop`` ends its whole
process group (vLLM's engine processes outlive a parent killed alone, and keep the port), and
every handle not stopped is stopped at exit, on an exception, and on SIGTERM or SIGHUP (which
otherwise end Python without running ``atexit``: they are made to interrupt the program as
Ctrl-C does, where their default action would apply).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.client.health import wait_healthy
from agentgym.client.versions import record_weight_version
from agentgym.server.http_timeouts import READ_TIMEOUT_S, WRITE_TIMEOUT_S, timed_protocol

if TYPE_CHECKING:
    import torch


class PolicyServerHandle:
    """A running policy server. Subclasses start it; this is what every caller relies on.
    ``admin_key``: the key its control routes (pause, weight updates) take, where it has one."""

    url: str
    backend: str
    model: str
    admin_key: str | None = None

    def update_weights(self, weights: str | os.PathLike[str] | dict[str, torch.Tensor], version: int) -> int:
        """Load ``weights`` (a path the server can read, or a state dict) as ``version``; returns it
        once the server answers with the new weights."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def pause_generation(self) -> None:
        """Stop admitting and end running generations, each answered with what it sampled so far and
        ``finish_reason="abort"`` (partial rollout: callers continue them after ``resume_generation``)."""
        raise NotImplementedError(f"partial rollout needs servers that abort generations; {type(self).__name__} cannot")

    def resume_generation(self) -> None:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``url + "/v1"``)."""
        return self.url + "/v1"

    def client(self, **kwargs: Any) -> Any:
        """A ``PolicyClient`` for this server."""
        from agentgym.client import PolicyClient

        kwargs.setdefault("admin_key", self.admin_key)
        return PolicyClient(self.url, backend=self.backend, model=self.model, **kwargs)

    def __enter__(self) -> PolicyServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, backend={self.backend!r}, model={self.model!r})"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket for uvicorn (``port=0``: a free port).

    ``IPPROTO_TCP`` matters: asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto`` says
    TCP, and accepted connections inherit it. With proto 0, every small response on a
    keep-alive connection waits ~40 ms for the client's delayed ACK.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ensure_port_free(host: str, port: int) -> None:
    """Raise a clear error if something already listens on ``host:port`` (a server started
    there would fail, or worse, its ``/health`` would be answered by the one already there)."""
    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise RuntimeError(
            f"port {port} on {host} is already in use ({exc.strerror}): is a policy server from an earlier run "
            f"still up? See what holds it (ss -ltnp 'sport = :{port}'), stop it, or choose another --port."
        ) from None


class AppThread:
    """Any ASGI app served by uvicorn in a daemon thread of this process (``port=0``: a free port).
    Connections that send a request slower than ``read_timeout`` or stop reading their answer for
    ``write_timeout`` seconds are closed (``agentgym.server.http_timeouts``)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        read_timeout: float = READ_TIMEOUT_S,
        write_timeout: float = WRITE_TIMEOUT_S,
    ) -> None:
        import uvicorn

        self.app = app
        self._sock = bind_socket(host, port)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
            http=timed_protocol(read_timeout, write_timeout),
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=f"agentgym-http-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn did not start on {host}:{port}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._sock.close()


class EmbeddedServerHandle(PolicyServerHandle):
    """The embedded server running in this process: uvicorn in a daemon thread over an ``Engine``.
    ``admin_key`` guards its control routes (None: a new random one, in ``.admin_key``);
    ``limits``: a ``ServerLimits``."""

    backend = "embedded"

    def __init__(
        self,
        engine: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        admin_key: str | None = None,
        limits: Any = None,
    ) -> None:
        from agentgym.server.app import build_app

        self.engine = engine
        self.model = engine.model_name
        app = build_app(engine, admin_key=admin_key, limits=limits)
        self.admin_key: str | None = app.state.admin_key
        self._http = AppThread(app, host, port, log_level)
        self.app, self.port, self.url = self._http.app, self._http.port, self._http.url

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def update_weights(self, weights: str | os.PathLike[str] | dict[str, torch.Tensor], version: int) -> int:
        """In process: the state dict is copied straight into the model between responses."""
        from agentgym.model.weights import load_weights

        state = weights if isinstance(weights, dict) else load_weights(weights)
        return self.engine.update_weights(state, version).result()

    def pause_generation(self) -> None:
        self.engine.pause("abort").result()

    def resume_generation(self) -> None:
        self.engine.resume()

    def stop(self) -> None:
        self._http.stop()
        self.engine.stop()


class SubprocessServerHandle(PolicyServerHandle):
    """A server command run in its own process group, its output in a log file.

    ``wait_ready`` polls ``/health``; if the process dies or the time runs out it raises with the
    tail of the log. ``stop`` sends SIGTERM to the whole group, then SIGKILL to what is left after
    ``grace`` s; it is called at exit for every handle still running (see the module docstring).
    """

    def __init__(
        self,
        command: list[str],
        url: str,
        backend: str,
        model: str,
        weights: Any,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        grace: float = 15.0,
        admin_key: str | None = None,
    ) -> None:
        self.command = command
        self.url = url.rstrip("/")
        self.backend = backend
        self.model = model
        self.weights = weights
        self.admin_key = admin_key
        self.grace = grace
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix=f"agentgym-{backend}-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        _stop_at_exit()
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        _running.add(self)
        self.weight_version = 0
        record_weight_version(self.url, 0)  # not what an earlier server on this port was pushed

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(collections.deque(f, maxlen=lines))
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = 600.0, interval: float = 0.5) -> None:
        if wait_healthy(self.url, lambda: self.process.poll() is not None, timeout, interval):
            return
        code = self.process.poll()
        self.stop()  # whatever it started goes with it
        if code is not None:
            raise RuntimeError(
                f"the {self.backend} server exited with code {code} before it was ready.\n"
                f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
            )
        raise TimeoutError(
            f"the {self.backend} server at {self.url} did not answer /health within {timeout:.0f} s.\n"
            f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
        )

    def update_weights(self, weights: str | os.PathLike[str] | dict[str, torch.Tensor], version: int) -> int:
        """A path is handed to the server as is; a state dict goes through shared memory
        (``/dev/shm``, same host only) and the file is removed afterwards."""
        if isinstance(weights, dict):
            self.weights.update_from_state_dict(self.url, weights, version)
        else:
            self.weights.update_from_disk(self.url, str(weights), version)
        self.weight_version = version
        return version

    def pause_generation(self) -> None:
        """Through the engine's own route (vLLM ``/pause?mode=abort``, SGLang ``/pause_generation``)."""
        self.weights.pause(self.url, "abort")

    def resume_generation(self) -> None:
        self.weights.resume(self.url)

    def stop(self) -> None:
        """End the server's whole process group, even when its first process has already gone."""
        _running.discard(self)
        group = self.process.pid  # start_new_session: the group's id is the leader's pid
        if _signal_group(group, signal.SIGTERM):
            deadline = time.monotonic() + self.grace
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=self.grace)
            while _signal_group(group, 0) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _signal_group(group, signal.SIGKILL):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=10)
        self.process.poll()
        if not self._log.closed:
            self._log.close()


def _signal_group(group: int, sig: int) -> bool:
    """Send ``sig`` to the process group; False when no process of it is left."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - the id was reused by someone else's group
        return False
    return True


_running: set[SubprocessServerHandle] = set()  # strong references: a handle dropped unstopped is still stopped
_exit_hooks: list[bool] = []


def _stop_running() -> None:
    for handle in list(_running):
        with contextlib.suppress(Exception):  # best effort on the way out
            handle.stop()


def _stop_at_exit() -> None:
    """Once per process: stop running servers at exit, and make SIGTERM/SIGHUP interrupt the
    program as Ctrl-C does (``KeyboardInterrupt``: ``finally`` blocks and ``atexit`` run; a test
    session or a command stops as it would on Ctrl-C) instead of ending it on the spot."""
    if _exit_hooks:
        return
    _exit_hooks.append(True)
    atexit.register(_stop_running)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, signal.default_int_handler)
