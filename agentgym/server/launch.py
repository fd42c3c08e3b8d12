"""Starting policy servers: ``agentgym serve`` and the handles code and tests hold.

Every server, whichever engine runs it, is a ``PolicyServerHandle``: ``.url`` (base URL, no
``/v1``), ``.backend`` (``embedded`` | ``vllm`` | ``sglang``, the ``PolicyClient`` dialect),
``.model`` (the name it answers to), ``.update_weights(path_or_state, version)`` and
``.stop()``; it is also a context manager.

* ``start_embedded_server(model="tiny", port=0)`` runs the embedded server in this process
  (uvicorn in a background thread; weight pushes then skip serialization entirely) or, with
  ``in_process=False``, as ``agentgym serve`` in a child process.
* ``start_policy_server(engine, model, ...)`` does the same for ``vllm`` and ``sglang``
  (``agentgym.server.engines``).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class PolicyServerHandle:
    """A running policy server. Subclasses start it; this is what every caller relies on."""

    url: str
    backend: str
    model: str

    def update_weights(self, weights: str | os.PathLike[str] | dict[str, torch.Tensor], version: int) -> int:
        """Load ``weights`` (a path the server can read, or a state dict) as ``version``; returns it
        once the server answers with the new weights."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``url + "/v1"``)."""
        return self.url + "/v1"

    def client(self, **kwargs: Any) -> Any:
        """A ``PolicyClient`` for this server."""
        from agentgym.server.client import PolicyClient

        return PolicyClient(self.url, backend=self.backend, model=self.model, **kwargs)

    def __enter__(self) -> PolicyServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, backend={self.backend!r}, model={self.model!r})"


# ---- the embedded server, in this process ------------------------------------------------------
def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def create_engine(model: str = "tiny", *, device: str | None = None, dtype: str | None = None,
                  max_batch_size: int = 32, max_model_len: int | None = None, served_model_name: str | None = None,
                  ) -> Any:
    """Load ``model`` and start an ``Engine`` thread on it (fp32 on CPU, bf16 on a GPU by default)."""
    from agentgym.model import load_causal_lm, load_tokenizer
    from agentgym.server.engine import Engine

    device = device or default_device()
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    tokenizer = load_tokenizer(str(model))
    lm = load_causal_lm(str(model), dtype=dtype, device=device)
    engine = Engine(lm, tokenizer, model_name=served_model_name or str(model), max_batch_size=max_batch_size,
                    max_model_len=max_model_len)
    return engine.start()


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


def wait_healthy(url: str, give_up: Any = lambda: False, timeout: float = 120.0, interval: float = 0.1) -> bool:
    """Poll ``url/health`` until it answers 200 (True), or ``give_up()`` is true or ``timeout``
    seconds pass (False: the caller says which went wrong, and how)."""
    import httpx

    deadline = time.monotonic() + timeout
    while not give_up():
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return False


class AppThread:
    """Any ASGI app served by uvicorn in a daemon thread of this process (``port=0``: a free port)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        self.app = app
        self._sock = bind_socket(host, port)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"agentgym-http-{self.port}", daemon=True)
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
    """The embedded server running in this process: uvicorn in a daemon thread over an ``Engine``."""

    backend = "embedded"

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        from agentgym.server.app import build_app

        self.engine = engine
        self.model = engine.model_name
        self._http = AppThread(build_app(engine), host, port, log_level)
        self.app, self.port, self.url = self._http.app, self._http.port, self._http.url

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def update_weights(self, weights: str | os.PathLike[str] | dict[str, torch.Tensor], version: int) -> int:
        """In process: the state dict is copied straight into the model between responses."""
        from agentgym.server.weights import load_weights

        state = weights if isinstance(weights, dict) else load_weights(weights)
        return self.engine.update_weights(state, version).result()

    def stop(self) -> None:
        self._http.stop()
        self.engine.stop()


def start_embedded_server(model: str = "tiny", port: int = 0, host: str = "127.0.0.1", *, in_process: bool = True,
                          device: str | None = None, dtype: str | None = None, max_batch_size: int = 32,
                          max_model_len: int | None = None, served_model_name: str | None = None,
                          timeout: float = 120.0) -> PolicyServerHandle:
    """Start the embedded server on ``model``; ``port=0`` picks a free port (see ``.url``).

    ``in_process=True`` (default): a thread in this process. ``False``: ``agentgym serve`` in a
    child process (its own process group), returned once ``/health`` answers.
    """
    if in_process:
        engine = create_engine(model, device=device, dtype=dtype, max_batch_size=max_batch_size,
                               max_model_len=max_model_len, served_model_name=served_model_name)
        try:
            return EmbeddedServerHandle(engine, host=host, port=port)
        except BaseException:
            engine.stop()
            raise
    port = port or free_port(host)
    command = [sys.executable, "-m", "agentgym.cli", "serve", "--engine", "embedded", "--model", str(model),
               "--host", host, "--port", str(port), "--max-batch-size", str(max_batch_size)]
    if device:
        command += ["--device", device]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    from agentgym.model import resolve_model_path
    from agentgym.server.engines import EmbeddedWeights

    handle = SubprocessServerHandle(command, f"http://{host}:{port}", "embedded", served_model_name or str(model),
                                    EmbeddedWeights(model_dir=resolve_model_path(model)))
    handle.wait_ready(timeout)
    return handle


def start_policy_server(engine: str = "embedded", model: str = "tiny", port: int = 0, **kwargs: Any
                        ) -> PolicyServerHandle:
    """One door to every engine: ``embedded`` (kwargs of ``start_embedded_server``), ``vllm`` or
    ``sglang`` (kwargs of ``agentgym.server.engines.start_engine_server``)."""
    if engine == "embedded":
        return start_embedded_server(model, port, **kwargs)
    from agentgym.server.engines import start_engine_server

    return start_engine_server(engine, model, port=port, **kwargs)


# ---- any server in a child process ---------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SubprocessServerHandle(PolicyServerHandle):
    """A server command run in its own process group, its output in a log file.

    ``wait_ready`` polls ``/health``; if the process dies or the time runs out it raises with the
    tail of the log. ``stop`` sends SIGTERM to the whole group, then SIGKILL after ``grace`` s.
    """

    def __init__(self, command: list[str], url: str, backend: str, model: str, weights: Any,
                 env: dict[str, str] | None = None, log_path: str | os.PathLike[str] | None = None,
                 grace: float = 15.0) -> None:
        self.command = command
        self.url = url.rstrip("/")
        self.backend = backend
        self.model = model
        self.weights = weights
        self.grace = grace
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix=f"agentgym-{backend}-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})}, start_new_session=True)
        self.weight_version = 0

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
        if code is not None:
            raise RuntimeError(
                f"the {self.backend} server exited with code {code} before it was ready.\n"
                f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}")
        self.stop()
        raise TimeoutError(
            f"the {self.backend} server at {self.url} did not answer /health within {timeout:.0f} s.\n"
            f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}")

    def update_weights(self, weights: str | os.PathLike[str] | dict[str, torch.Tensor], version: int) -> int:
        """A path is handed to the server as is; a state dict goes through shared memory
        (``/dev/shm``, same host only) and the file is removed afterwards."""
        if isinstance(weights, dict):
            self.weights.update_from_state_dict(self.url, weights, version)
        else:
            self.weights.update_from_disk(self.url, str(weights), version)
        self.weight_version = version
        return version

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass
        self._log.close()


# ---- agentgym serve --------------------------------------------------------------------------------
def serve_command(args: argparse.Namespace) -> int:
    """``agentgym serve``: run a policy server in the foreground until Ctrl-C."""
    if args.engine != "embedded":
        from agentgym.server.engines import start_engine_server

        print(f"starting {args.engine} on {args.model} (waits for /health) ...", flush=True)
        try:
            handle = start_engine_server(
                args.engine, args.model, host=args.host, port=args.port,
                tensor_parallel_size=args.tensor_parallel_size, gpu_memory_utilization=args.gpu_memory_utilization,
                max_model_len=args.max_model_len, tool_call_parser=args.tool_call_parser, log_path=None,
                served_model_name=getattr(args, "served_model_name", None))
        except (RuntimeError, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{args.engine} server ready at {handle.url} (log: {handle.log_path}); Ctrl-C stops it", flush=True)
        try:
            while handle.process.poll() is None:
                time.sleep(1.0)
            print(f"{args.engine} server exited with code {handle.process.returncode}; last lines:\n"
                  f"{handle.log_tail()}", file=sys.stderr)
            return handle.process.returncode or 1
        finally:
            handle.stop()

    import uvicorn

    from agentgym.server.app import build_app

    print(f"loading {args.model} ...", flush=True)
    engine = create_engine(args.model, device=args.device, max_batch_size=args.max_batch_size,
                           max_model_len=args.max_model_len, served_model_name=getattr(args, "served_model_name", None))
    app = build_app(engine)
    print(f"agentgym embedded server: model {engine.model_name!r} on {engine.device}, "
          f"max_model_len {engine.max_model_len}, max batch {engine.max_batch_size}; "
          f"http://{args.host}:{args.port}/v1", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        engine.stop()
    return 0
