"""``MCPConnection``: one live MCP client session, driven from synchronous code.

agentgym runs tools synchronously (``Tool.execute`` on an env thread), the MCP SDK is async. Every
connection of a process lives on one event loop running on its own daemon thread
(``agentgym-mcp``); a call is a coroutine handed to that loop, and the calling thread waits for it
at most ``call_timeout_s`` (+ a small grace). So a server that hangs costs a call its timeout and
no more, and one that died answers at once with an error - never a hang.

Each connection is one task on the loop that enters the transport (stdio or streamable HTTP)
and the ``ClientSession``, lists the tools, then waits to be closed: the SDK's task groups are
entered and left by the same task, as anyio requires. Connections to the same server
(``MCPServerConfig.server_key``) are shared by the envs of a process (reference counted) unless
``shared: false``.

A stdio server starts through ``launch.py``: its own session and process group (the SDK),
SIGKILL when the agentgym thread that started it dies, no core files, an optional memory cap. On
close the SDK closes its stdin, waits 2 s, then SIGTERM/SIGKILLs the group; agentgym then SIGKILLs
whatever is left of the group (children the server started that outlived it).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import datetime
import logging
import os
import signal
import sys
import threading
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentgym.envs.tools.mcp.config import MCPServerConfig

logger = logging.getLogger(__name__)
LAUNCHER = str(Path(__file__).with_name("launch.py"))
GRACE_S = 0.1  # how much past its timeout a call may wait for the loop to hand back the SDK's own timeout
TAG_VARIABLE = "AGENTGYM_MCP_SERVER"  # set to a fresh id in each stdio server's environment
PYTHON_NAMES = ("python", "python3")  # a stdio command named so runs with sys.executable (and $PYTHONPATH)
CLOSE_TIMEOUT_S = 5.0  # the SDK's stdin-close / SIGTERM / SIGKILL sequence takes at most ~4 s


class MCPUnavailable(RuntimeError):
    """The ``mcp`` package is not installed, or a server could not be started / reached."""


class MCPCallError(Exception):
    """A call failed; ``kind`` is ``timeout``, ``server_dead`` or ``mcp_error``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise MCPUnavailable("tools from MCP servers need the mcp package: pip install 'agentgym[mcp]'") from None


# ---- the loop thread ------------------------------------------------------------------------
_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0


def mcp_loop() -> asyncio.AbstractEventLoop:
    """The process's MCP event loop, started on its daemon thread on first use (and again after a fork)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="agentgym-mcp", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
            _shared.clear()  # a forked child does not own its parent's connections
        return _loop


# ---- one connection ---------------------------------------------------------------------------
class MCPConnection:
    """A started MCP session to one server: ``tools`` (the SDK's ``Tool`` objects) and ``call``."""

    def __init__(self, config: MCPServerConfig) -> None:
        require_mcp()
        self.config = config
        self.refs = 0
        self.restarts = 0
        self.session: Any = None
        self.tools: list[Any] = []
        self.dead: str | None = None  # why it is not running, once it is not
        self.pid: int | None = None  # stdio: the server's process (and process group) id
        self._stop: asyncio.Event | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()
        self._start()

    # -- lifecycle
    def _start(self) -> None:
        loop = mcp_loop()
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self.dead = None
        self._main = asyncio.run_coroutine_threadsafe(self._run(ready), loop)
        try:
            self.tools = ready.result(self.config.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            self._kill_group()  # it is not speaking MCP: no polite shutdown
            if self._main is not None:
                self._main.cancel()
            self._shutdown()
            raise MCPUnavailable(
                f"MCP server {self.config.name!r} ({self.config.where}) did not answer the handshake and tool list "
                f"within connect_timeout_s={self.config.connect_timeout_s:g} s"
            ) from None
        except Exception as exc:
            self._shutdown()
            raise MCPUnavailable(
                f"MCP server {self.config.name!r} ({self.config.where}) could not be started: {describe_error(exc)}"
            ) from exc

    async def _run(self, ready: concurrent.futures.Future[list[Any]]) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                ended = asyncio.Event()
                read = await stack.enter_async_context(_watch(read, ended))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools: list[Any] = []
                cursor = None
                while True:
                    page = await session.list_tools(cursor) if cursor else await session.list_tools()
                    tools.extend(page.tools)
                    cursor = page.nextCursor
                    if not cursor:
                        break
                self.session = session
                ready.set_result(tools)
                stop, eof = asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(ended.wait())
                try:
                    await asyncio.wait([stop, eof], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    eof.cancel()
                if ended.is_set() and not self._stop.is_set():
                    self.dead = "it closed the connection (exited or crashed)"
        except BaseException as exc:  # noqa: BLE001 - kept as the reason; the caller hears it
            self.dead = describe_error(exc)
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(self.dead))
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self.dead = self.dead or "closed"
            self.session = None
            self._kill_group()

    def _transport(self) -> Any:
        config = self.config
        if config.command:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            self._tag = uuid.uuid4().hex
            command = [sys.executable, LAUNCHER, "--parent", str(os.getpid())]
            if config.memory_mb:
                command += ["--memory-mb", str(config.memory_mb)]
            env = {**dict(config.env), TAG_VARIABLE: self._tag}  # survives exec: how _find_pid knows it
            program = config.command
            if program in PYTHON_NAMES:  # this interpreter, its packages importable as they are here
                program = sys.executable
                if os.environ.get("PYTHONPATH") and "PYTHONPATH" not in env:
                    env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            command += ["--", program, *config.args]
            params = StdioServerParameters(command=command[0], args=command[1:], env=env or None, cwd=config.cwd)
            return _remember_pid(stdio_client(params, errlog=_stderr()), self)
        import httpx

        try:
            from mcp.client.streamable_http import streamable_http_client
        except ImportError:  # mcp < 1.24
            from mcp.client.streamable_http import streamablehttp_client

            return _two(streamablehttp_client(config.url, headers=dict(config.headers) or None))
        client = httpx.AsyncClient(
            headers=dict(config.headers), timeout=httpx.Timeout(config.connect_timeout_s, read=None)
        )
        return _two(streamable_http_client(config.url, http_client=client), client)

    async def _find_pid(self) -> None:
        """The launched server's pid (= its process group id), found by the tag in its environment
        (looked for again for up to 2 s: between fork and exec a child still has our environment)."""
        import psutil

        for _ in range(200):
            for child in psutil.Process().children(recursive=False):
                with contextlib.suppress(psutil.Error):
                    if child.environ().get(TAG_VARIABLE) == self._tag:
                        self.pid = child.pid
                        return
            await asyncio.sleep(0.01)
        logger.warning("MCP server %r: its process was not found; it is killed by the SDK only", self.config.name)

    def _kill_group(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def _shutdown(self) -> None:
        loop = mcp_loop()
        if self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            try:
                self._main.result(CLOSE_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                self._main.cancel()
            except BaseException:  # noqa: BLE001 - already recorded in self.dead
                pass
        self._kill_group()

    def close(self) -> None:
        """End the session; a stdio server's whole process group is gone when this returns."""
        with self._lock:
            self._shutdown()
            self.dead = self.dead or "closed"

    # -- calls
    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> tuple[Any, float]:
        """``(CallToolResult, seconds)`` of one call; raises ``MCPCallError`` on timeout, death or a
        protocol error, always within ``timeout`` (+ ``GRACE_S``) after the server is up."""
        self._revive()
        session = self.session
        if session is None:
            raise MCPCallError(self._dead_message(), "server_dead")
        start = time.perf_counter()
        future = asyncio.run_coroutine_threadsafe(
            session.call_tool(name, arguments, read_timeout_seconds=datetime.timedelta(seconds=timeout)),
            mcp_loop(),
        )
        main = self._main
        # the call's answer, or the connection's end (a transport that failed: an HTTP server that
        # went away), whichever comes first
        concurrent.futures.wait(
            [future, main] if main is not None else [future],
            timeout + GRACE_S,
            return_when=concurrent.futures.FIRST_COMPLETED,
        )
        if not future.done():
            future.cancel()
            if main is not None and main.done():
                raise MCPCallError(self._dead_message(), "server_dead")
            raise MCPCallError(self._timeout_message(name, timeout), "timeout")
        try:
            result = future.result()
        except concurrent.futures.CancelledError:
            raise MCPCallError(self._dead_message(), "server_dead") from None
        except Exception as exc:
            raise self._classify(name, exc, timeout) from None
        return result, time.perf_counter() - start

    def _classify(self, name: str, exc: Exception, timeout: float) -> MCPCallError:
        from mcp import McpError
        from mcp.types import CONNECTION_CLOSED

        if isinstance(exc, McpError):
            if exc.error.code == CONNECTION_CLOSED:
                self.dead = self.dead or "the connection closed"
                return MCPCallError(self._dead_message(), "server_dead")
            if "Timed out" in exc.error.message:
                return MCPCallError(self._timeout_message(name, timeout), "timeout")
            message = f"the MCP server {self.config.name!r} refused the call: {exc.error.message}"
            return MCPCallError(message, "mcp_error")
        if (self._main is not None and self._main.done()) or isinstance(exc, (OSError, EOFError)):
            self.dead = self.dead or describe_error(exc)
            return MCPCallError(self._dead_message(), "server_dead")
        return MCPCallError(f"the call to MCP server {self.config.name!r} failed: {describe_error(exc)}", "mcp_error")

    def _revive(self) -> None:
        """Start a dead server again (at most ``max_restarts`` times in this connection's life)."""
        if self._healthy():
            return
        with self._lock:
            if self._healthy() or self.restarts >= self.config.max_restarts or self.dead == "closed":
                self.session = self.session if self._healthy() else None
                return
            self.restarts += 1
            logger.warning(
                "MCP server %r is not running (%s); starting it again (%d of %d)",
                self.config.name,
                self.dead,
                self.restarts,
                self.config.max_restarts,
            )
            self._shutdown()
            try:
                self._start()
            except MCPUnavailable as exc:
                self.dead = str(exc)

    def _healthy(self) -> bool:
        return self.dead is None and self.session is not None and not (self._main is not None and self._main.done())

    def _dead_message(self) -> str:
        left = self.config.max_restarts - self.restarts
        again = " It will be started again on a later call." if left > 0 and self.dead != "closed" else ""
        return f"the MCP server {self.config.name!r} is not running ({self.dead or 'unknown reason'}).{again}"

    def _timeout_message(self, name: str, timeout: float) -> str:
        return f"{name} (MCP server {self.config.name!r}) did not answer within {timeout:g} s"


def describe_error(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups (anyio's task groups raise them)."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (anyio task groups; Python 3.11+)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text


def _stderr() -> Any:
    """Where a stdio server's stderr goes: ours (a real file; pytest's capture objects have no fileno)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__


@contextlib.asynccontextmanager
async def _remember_pid(transport: Any, connection: MCPConnection) -> Any:
    async with transport as streams:
        await connection._find_pid()
        yield streams


@contextlib.asynccontextmanager
async def _watch(read: Any, ended: asyncio.Event) -> Any:
    """``read`` passed through a new stream, setting ``ended`` when the server's side of it ends."""
    import anyio

    send, receive = anyio.create_memory_object_stream(0)

    async def forward() -> None:
        try:
            async with send:
                async for item in read:
                    await send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass
        finally:
            ended.set()

    async with anyio.create_task_group() as group:
        group.start_soon(forward)
        try:
            yield receive
        finally:
            group.cancel_scope.cancel()
            await receive.aclose()


@contextlib.asynccontextmanager
async def _two(transport: Any, client: Any = None) -> Any:
    """``(read, write)`` of a streamable-HTTP transport (it yields a third item, the session id getter)."""
    try:
        async with transport as (read, write, *_):
            yield read, write
    finally:
        if client is not None:
            await client.aclose()


# ---- sharing ------------------------------------------------------------------------------------
_shared: dict[tuple[Any, ...], MCPConnection] = {}  # by MCPServerConfig.server_key
_shared_lock = threading.Lock()


def acquire(config: MCPServerConfig) -> MCPConnection:
    """A connection for ``config`` with one more reference: the process's shared one, or a new one."""
    if not config.shared:
        connection = MCPConnection(config)
        connection.refs = 1
        return connection
    with _shared_lock:
        mcp_loop()  # resets _shared after a fork
        connection = _shared.get(config.server_key)
        if connection is None or connection.dead == "closed":
            connection = _shared[config.server_key] = MCPConnection(config)
        connection.refs += 1
        return connection


def retain(connection: MCPConnection) -> None:
    with _shared_lock:
        connection.refs += 1


def release(connection: MCPConnection) -> None:
    """Drop one reference; the last one closes the connection (and kills a stdio server's group)."""
    with _shared_lock:
        connection.refs -= 1
        if connection.refs > 0:
            return
        if _shared.get(connection.config.server_key) is connection:
            del _shared[connection.config.server_key]
    connection.close()


def _close_all() -> None:
    with _shared_lock:
        connections = list(_shared.values())
        _shared.clear()
    for connection in connections:
        with contextlib.suppress(Exception):
            connection.close()


atexit.register(_close_all)  # a clean close at exit (a killed process: the servers' PDEATHSIG)
