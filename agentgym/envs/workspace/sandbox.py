"""``WorkspaceSandbox``: a sandboxed workspace that lives for one episode.

One bubblewrap sandbox per episode, built like the python tool's strong sandbox
(``agentgym.envs.tools.sandbox``) and kept alive between the episode's calls: its only long-lived
process is a small server (``server.py``, the system ``python3``) that runs each request (a ``bash``
command, a file read or write) and kills every process the request started before it answers. The
workspace is a size-capped tmpfs mounted at ``/workspace`` inside the sandbox: it exists in no
directory of the host, so it cannot outlive the sandbox, and the sandbox cannot outlive its caller.

Why one sandbox per episode instead of one per call: a fresh ``bwrap`` per call costs ~5 ms and a
cgroup pair per call ~10-30 ms more on cgroup v1, and state (files, the working directory) would
have to live on the host between calls, where a size cap needs a mount and a crash leaves files.
Keeping the sandbox meets the start-up and round-trip budgets (see ``benchmarks/workspace.py``) and
makes the workspace anonymous memory of that sandbox.

Guaranteed (the same boundary as the python tool's strong mode; needs ``bwrap`` and, as root,
``setpriv``; where they cannot run, building a sandbox raises ``SandboxUnavailable`` saying what is
missing - there is no weaker fallback):

* **user**: as root, everything in the sandbox runs as uid/gid 65534 (``nobody``) with no
  supplementary groups, no capabilities, no_new_privs. As another user it keeps that user's uid
  inside a user namespace and cannot make another one.
* **files**: a new mount namespace whose root is read-only and holds only ``/usr`` (+ the ``/bin``,
  ``/lib*`` links: ``bash``, coreutils, ``grep``, ``find``, ``sed``, ``git``, ``python3`` ...), a few
  harmless ``/etc`` files, a private ``/proc`` and a minimal ``/dev``. Writable: ``/workspace`` (the
  working directory; tmpfs of ``max_disk_mb``), ``/tmp`` (``HOME``) and ``/dev/shm`` (tmpfs of
  ``max_tmp_mb`` each). Nothing else of the host exists there: not ``/root``, ``/home``, ``/work``,
  ``/run``, ``/var``, ``/sys``, the host's ``/tmp``, other episodes' workspaces, or sockets.
* **processes**: a new PID namespace per episode: the episode sees only its own processes. Each
  ``bash`` call runs in its own session; when it returns (exit or timeout) every other process in
  the sandbox is SIGKILLed - background jobs, daemons and ``setsid`` escapes included - so nothing
  the agent started runs between calls or after its last one.
* **network**: a new network namespace with only a loopback; private System V IPC and hostname.
* **limits, per call**: wall-clock ``timeout_s``; CPU seconds (``RLIMIT_CPU``); address space per
  process ``memory_mb``; file size ``max_file_mb``; output kept: ``max_output_bytes`` (the rest is
  read and dropped, so a flood cannot block or fill anything). **Per episode**: processes+threads
  ``max_processes`` (pids cgroup, else ``RLIMIT_NPROC``); the workspace's size ``max_disk_mb``; where a
  memory cgroup can be made, all of the sandbox's memory, tmpfs files included, below
  ``memory_mb + max_disk_mb + 2*max_tmp_mb``; 256 open files; no real-time scheduling.
* **system calls** (x86_64): the python tool's seccomp filter (no namespaces, mounts, keyrings,
  bpf, ptrace, io_uring, ...; sockets of ``AF_UNIX`` only).
* **lifetime**: the sandbox is killed, and its workspace freed with it, on ``close()``, when its
  object is collected, and when the caller dies however it dies (SIGKILL included: the kernel's
  parent-death signal on ``bwrap``, which is started from one long-lived thread, and bwrap's
  ``--die-with-parent``). The only host-side trace is the episode's cgroup directory, which the
  next agentgym process to make cgroups removes (the python tool's stale-cgroup sweep).
* **the server**: it is the PID namespace's init (no bwrap init holds the host's pipes in there)
  and non-dumpable, so code running as the same user cannot read its memory or descriptors, nor
  write the host a reply; as init it cannot be killed or stopped from inside. Where it dies anyway
  (memory, ``SIGINT``, ``prlimit``), only its own episode ends (the call fails with
  ``WorkspaceError``, the verifier scores the episode 0).

Not protected against: reading what is mounted read-only (``/usr``), kernel bugs (the filter
narrows the surface), CPU and memory-bandwidth contention with the host.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import itertools
import logging
import marshal
import os
import queue
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentgym.envs.tools.sandbox.bubblewrap import (  # the python tool's pieces of the same boundary
    PATH,
    SANDBOX_GID,
    SANDBOX_UID,
    SYSTEM_DIRS,
    SandboxUnavailable,
    _bind_roots,
    _outermost,
    isolation_argv,
    strong_problem,
)
from agentgym.envs.tools.sandbox.process import (
    RunCgroup,
    capped,
    forget_cgroups,
    make_preexec,
    make_run_cgroups,
    user_task_count,
)
from agentgym.envs.tools.sandbox.seccomp import filter_program

WORKSPACE = "/workspace"
SERVER_PYTHON = "/usr/bin/python3"  # the system Python runs the server; else this interpreter, bound read-only


def server_python() -> tuple[str, list[str]]:
    """``(interpreter, directories to bind read-only)`` for the server: the system ``python3`` (under
    /usr, bound anyway), else this process's *base* interpreter (a GPU image may keep its Python in
    /opt) with only its installation's directories: not a virtual environment's, whose site-packages
    and neighbours (a project checkout, a task suite's hidden tests) the agent must not read. The
    installation's own site-packages are masked (``hidden_site_packages``); the server runs with
    ``-I -S`` and needs none of them."""
    if os.access(SERVER_PYTHON, os.X_OK):
        return SERVER_PYTHON, []
    exe = os.path.realpath(sys.executable)
    prefixes = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(exe))}
    return exe, _outermost(sorted({os.path.realpath(p) for p in prefixes}))


def hidden_site_packages(roots: list[str]) -> list[str]:
    """The package directories inside the bound interpreter ``roots`` (masked by an empty read-only tmpfs)."""
    found: set[str] = set()
    for root in roots:
        for pattern in ("lib*/python3*/site-packages", "lib*/python3*/dist-packages", "lib/site-packages"):
            found.update(os.path.realpath(p) for p in glob.glob(os.path.join(root, pattern)))
    return sorted(p for p in found if os.path.isdir(p) and any(p.startswith(r.rstrip("/") + "/") for r in roots))


SERVER_SOURCE = (Path(__file__).with_name("server.py")).read_text()
MAX_HEADER = 1 << 16
START_TIMEOUT_S = 30.0
HOST_MARGIN_S = 5.0  # how much longer than a request's own bound the host waits before declaring the sandbox dead
T = TypeVar("T")
logger = logging.getLogger(__name__)


class WorkspaceError(RuntimeError):
    """The episode's sandbox failed (it died, or stopped answering); it is closed."""


@dataclass(frozen=True)
class WorkspaceLimits:
    """Bounds of one episode's sandbox (per call unless said otherwise)."""

    timeout_s: float = 10.0  # wall clock per bash call
    memory_mb: int = 1024  # address space per process
    max_processes: int = 64  # processes+threads in the sandbox at once (per episode)
    max_output_bytes: int = 16_000  # output kept per call
    max_file_mb: int = 16  # largest file a command may write
    max_disk_mb: int = 64  # size of /workspace (per episode)
    max_tmp_mb: int = 64  # size of /tmp and of /dev/shm (per episode)
    max_request_mb: int = 64  # largest file/archive sent through the server

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_output_bytes", "max_disk_mb", "max_tmp_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"WorkspaceLimits.{name} must be positive, got {getattr(self, name)}")


@dataclass
class CommandResult:
    """What one command did."""

    output: str  # stdout and stderr, merged in order, cut to max_output_bytes
    exit_code: int | None  # None on timeout; -N: killed by signal N
    timed_out: bool
    truncated: bool
    cwd: str  # the working directory after the command (it persists to the next one)
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class FileRead:
    exists: bool
    data: bytes = b""
    size: int = 0  # the file's full size
    truncated: bool = field(init=False)

    def __post_init__(self) -> None:
        self.truncated = self.size > len(self.data)


# ---- one thread starts every sandbox ---------------------------------------------------------------
# bwrap gets SIGKILL when the *thread* that forked it exits (PR_SET_PDEATHSIG follows threads): an
# episode reset on a pool thread that is later retired would lose its sandbox. This thread lives as
# long as the process, so the signal comes exactly when the process dies.
_spawn_queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn_loop() -> None:
    while True:
        fn, future = _spawn_queue.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the caller
            future.set_exception(exc)


def _on_spawner(fn: Callable[[], T]) -> T:
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_loop, name="agentgym-workspace-spawner", daemon=True)
            _spawner.start()
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    _spawn_queue.put((fn, future))
    return future.result()


# ---- the bubblewrap command line -------------------------------------------------------------------
def workspace_bwrap_argv(limits: WorkspaceLimits, seccomp_fd: int | None) -> tuple[list[str], list[str]]:
    """``(argv, layers)``: bubblewrap running the server with /workspace, /tmp and /dev/shm as tmpfs."""
    as_root = os.geteuid() == 0
    # the server is the namespace's pid 1 (--as-pid-1): no bwrap init in there. As another user than root that
    # init ran as the sandbox's uid, dumpable, holding the host's pipes (its stdin, stdout, stderr): code could
    # open /proc/1/fd/1 and write the host forged replies (a check's exit code included). As pid 1, the server
    # also cannot be signalled from inside (the kernel drops signals to a namespace's init that it has no
    # handler for), and its death ends every process of the episode.
    argv, layers = isolation_argv("--as-pid-1", "--hostname", "workspace")
    python, roots = server_python()
    made = {"/", "/usr", "/etc", *SYSTEM_DIRS}
    roots = [r for r in roots if not r.startswith(("/tmp/", "/dev/shm/"))]
    argv += _bind_roots(roots, made)
    for hidden in hidden_site_packages(roots):
        argv += ["--perms", "0555", "--size", "4096", "--tmpfs", hidden, "--remount-ro", hidden]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for mount, size in ((WORKSPACE, limits.max_disk_mb), ("/tmp", limits.max_tmp_mb), ("/dev/shm", limits.max_tmp_mb)):
        argv += ["--perms", "1777", "--size", str(size << 20), "--tmpfs", mount]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE]
    layers += ["read-only-root", "tmpfs-quota"]
    for name, value in {"PATH": PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}.items():
        argv += ["--setenv", name, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
        layers.append("seccomp")
    argv.append("--")
    if as_root:
        argv += [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_GID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    argv += [python, "-I", "-S", "-B", "-c", SERVER_SOURCE, str(limits.memory_mb), str(limits.max_file_mb)]
    return argv, layers


_problem: list[str | None] = []


def workspace_problem() -> str | None:
    """Why a workspace sandbox cannot run here, or None (the python tool's probe, plus the server's Python)."""
    if not _problem:
        problem = strong_problem()
        if problem is None and not os.access("/bin/bash", os.X_OK):
            problem = "the workspace needs /bin/bash"
        _problem.append(problem)
    return _problem[0]


def require_workspace() -> None:
    problem = workspace_problem()
    if problem is not None:
        raise SandboxUnavailable(
            f"The workspace sandbox cannot run here: {problem}. To fix this, install bubblewrap "
            "(Debian/Ubuntu: `apt-get install -y bubblewrap`), util-linux (setpriv) and python3 on a kernel "
            "that allows namespaces. There is no weaker mode for workspaces."
        )


_counter = itertools.count()


def parse_reply_line(line: bytes) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The fields of a reply line (``key=value`` ...: ``~`` None, ``?0``/``?1`` bool, ``@N`` a string of N
    bytes after the line, else an int or a float) and the strings to read, in order. Raises
    ``WorkspaceError`` on anything else."""
    fields: dict[str, Any] = {}
    strings: list[tuple[str, int]] = []
    for token in line.decode("ascii", "replace").split(" "):
        key, sep, value = token.partition("=")
        if not sep or not key.isidentifier() or len(value) > 40:
            raise WorkspaceError(f"malformed reply field {token[:60]!r}")
        if value == "~":
            fields[key] = None
        elif value in ("?0", "?1"):
            fields[key] = value == "?1"
        elif value.startswith("@") and value[1:].isdigit():
            strings.append((key, int(value[1:])))
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                try:
                    fields[key] = float(value)
                except ValueError:
                    raise WorkspaceError(f"malformed reply field {token[:60]!r}") from None
    return fields, strings


class WorkspaceSandbox:
    """One episode's sandbox: ``run`` commands, ``read``/``write`` files, ``archive``/``extract`` the
    workspace, ``close``. Thread-safe (one request at a time). Raises ``SandboxUnavailable`` where
    bubblewrap cannot run, ``WorkspaceError`` when the sandbox dies under it."""

    def __init__(self, limits: WorkspaceLimits | None = None, files: Mapping[str, str | bytes] | None = None) -> None:
        require_workspace()
        self.limits = limits or WorkspaceLimits()
        self.id = next(_counter)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroups: list[RunCgroup] = []
        self._buffer = b""
        self.layers: list[str] = []
        self.cwd = WORKSPACE
        self._proc, self._cgroups, self.layers, self._stderr = _on_spawner(self._start)
        try:
            with self._lock:
                try:
                    hello, _ = self._receive(time.monotonic() + START_TIMEOUT_S)
                except (OSError, ValueError, WorkspaceError) as exc:
                    raise WorkspaceError(self._death(f"the workspace sandbox did not start ({exc})")) from None
            if not hello.get("ready"):
                raise WorkspaceError(f"the workspace sandbox said {hello!r} instead of ready")
            if files:
                self.write_files(files)
        except BaseException:
            self.close()
            raise

    def _start(self) -> tuple[subprocess.Popen[bytes], list[RunCgroup], list[str], Any]:
        limits = self.limits
        program = filter_program()
        stderr = tempfile.TemporaryFile(prefix="agentgym-ws-")  # noqa: SIM115 - nameless; kept for the sandbox's life
        while True:
            filter_read = -1
            if program is not None:
                filter_read, filter_write = os.pipe()
                os.write(filter_write, program)
                os.close(filter_write)
            argv, layers = workspace_bwrap_argv(limits, filter_read if program is not None else None)
            run_limits = capped(
                {
                    resource.RLIMIT_AS: max(limits.memory_mb, 256) << 20,
                    resource.RLIMIT_FSIZE: max(limits.max_file_mb, limits.max_request_mb) << 20,
                    resource.RLIMIT_NOFILE: 256,
                    resource.RLIMIT_CORE: 0,
                    resource.RLIMIT_RTPRIO: 0,
                    resource.RLIMIT_NICE: 0,
                }
            )
            memory = (limits.memory_mb + limits.max_disk_mb + 2 * limits.max_tmp_mb) << 20
            # bwrap's monitor and the server come on top of the commands' own
            cgroups, cgroup_layers = make_run_cgroups(limits.max_processes + 3, memory)
            layers += ["rlimits", "session", *cgroup_layers]
            if "cgroup" not in cgroup_layers:
                uid = SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
                run_limits.update(capped({resource.RLIMIT_NPROC: user_task_count(uid) + limits.max_processes}))
                layers.append("nproc")
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd="/",
                    env={"PATH": PATH},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(filter_read,) if program is not None else (),
                    preexec_fn=make_preexec(run_limits, [c.join for c in cgroups]),
                )
            except subprocess.SubprocessError:  # joining a cgroup failed in the child: retry without
                for cgroup in cgroups:
                    cgroup.remove()
                if cgroups:
                    forget_cgroups()
                    continue
                raise
            except BaseException:
                for cgroup in cgroups:
                    cgroup.remove()
                stderr.close()
                raise
            finally:
                if program is not None:
                    os.close(filter_read)
            return proc, cgroups, layers, stderr

    # ---- requests ----------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The host pid of the sandbox's ``bwrap`` (every process of the episode descends from it)."""
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _request(self, header: dict[str, Any], payload: bytes = b"", wait_s: float = 30.0) -> tuple[dict, bytes]:
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                raise WorkspaceError(self._death("the workspace sandbox is not running"))
            try:
                deadline = time.monotonic() + wait_s + HOST_MARGIN_S
                request = marshal.dumps((header, payload), 4)
                self._send(b"%d\n" % len(request) + request, deadline)
                reply, data = self._receive(deadline)
            except (OSError, ValueError, WorkspaceError) as exc:
                why = self._death(f"the workspace sandbox stopped answering ({exc})")
                self._close_locked()
                raise WorkspaceError(why) from None
        if "error" in reply:
            raise ValueError(str(reply["error"]))
        return reply, data

    def _send(self, data: bytes, deadline: float) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise WorkspaceError("the sandbox took no request in time")
            written = os.write(fd, view[: 1 << 16])
            view = view[written:]

    def _read_some(self, deadline: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise WorkspaceError("no reply in time")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise WorkspaceError("the sandbox closed its output")
        return chunk

    def _receive(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        """One reply: a line of ``key=value`` fields (see ``server.py``), its strings, its payload."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_HEADER:
                raise WorkspaceError("reply header too long")
            self._buffer += self._read_some(deadline)
        line, self._buffer = self._buffer.split(b"\n", 1)
        fields, strings = parse_reply_line(line)
        size = fields.pop("size", 0)
        limit = (self.limits.max_request_mb << 20) + 4 * self.limits.max_output_bytes + MAX_HEADER
        if not isinstance(size, int) or size < 0 or size + sum(n for _, n in strings) > limit:
            raise WorkspaceError(f"reply of {size} bytes is over the limit")
        for key, length in strings:
            while len(self._buffer) < length:
                self._buffer += self._read_some(deadline)
            fields[key] = self._buffer[:length].decode("utf-8", "replace")
            self._buffer = self._buffer[length:]
        while len(self._buffer) < size:
            self._buffer += self._read_some(deadline)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return fields, data

    def _death(self, what: str) -> str:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            what += f" (exit status {proc.returncode})"
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            tail = self._stderr.read()[-600:].decode("utf-8", "replace").strip()
            if tail:
                what += f"; its last words: {tail}"
        return what

    def run(self, command: str, timeout_s: float | None = None, cwd: str | None = None) -> CommandResult:
        """Run ``command`` with ``bash -c`` in ``cwd``, else the working directory the previous command left."""
        timeout = self.limits.timeout_s if timeout_s is None else float(timeout_s)
        reply, _ = self._request(
            {"op": "run", "cmd": command, "timeout": timeout, "max_output": self.limits.max_output_bytes, "cwd": cwd},
            wait_s=timeout + 3.0,  # + the kill sweep
        )
        self.cwd = reply["cwd"]
        return CommandResult(
            output=reply["output"],
            exit_code=reply["exit_code"],
            timed_out=reply["timed_out"],
            truncated=reply["truncated"],
            cwd=reply["cwd"],
            seconds=reply["seconds"],
        )

    def write(self, path: str, content: str | bytes, force: bool = False) -> str:
        """Write a workspace file (parents made); ``force``: replace whatever is in the way without
        following symlinks (for the verifier's files). Returns the workspace-relative path.
        Raises ``ValueError`` for a path outside the workspace."""
        data = content.encode("utf-8", errors="surrogatepass") if isinstance(content, str) else bytes(content)
        if len(data) > self.limits.max_request_mb << 20:
            raise ValueError(f"{path}: {len(data)} bytes is over max_request_mb={self.limits.max_request_mb}")
        reply, _ = self._request({"op": "write", "path": path, "force": force}, data)
        return str(reply["path"])

    def write_files(self, files: Mapping[str, str | bytes]) -> int:
        """Write many workspace files in one request (a task's files at reset). Returns how many."""
        encoded = {
            str(path): text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
            for path, text in files.items()
        }
        data = marshal.dumps(encoded, 4)
        if len(data) > self.limits.max_request_mb << 20:
            raise ValueError(f"the files are {len(data)} bytes, over max_request_mb={self.limits.max_request_mb}")
        return int(self._request({"op": "files"}, data)[0]["count"])

    def read(self, path: str, max_bytes: int | None = None) -> FileRead:
        """A workspace file's first ``max_bytes`` (default: ``max_request_mb``)."""
        cap = (self.limits.max_request_mb << 20) if max_bytes is None else max_bytes
        reply, data = self._request({"op": "read", "path": path, "max_bytes": cap})
        return FileRead(bool(reply["exists"]), data, int(reply.get("file_size", 0)))

    def archive(self) -> bytes:
        """The workspace as a tar (symlinks as links)."""
        return self._request({"op": "archive"}, wait_s=60.0)[1]

    def extract(self, tar: bytes) -> None:
        self._request({"op": "extract"}, tar, wait_s=60.0)

    # ---- the end -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the sandbox (every process in it) and free its workspace. Idempotent."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
            proc.wait()
        for cgroup in self._cgroups:
            cgroup.kill_all()
            cgroup.remove()
        self._cgroups = []
        with contextlib.suppress(OSError, AttributeError):
            self._stderr.close()

    def __enter__(self) -> WorkspaceSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class SparePool:
    """Sandboxes started ahead of need, so that an episode's reset only writes its task's files.

    A spare is a fresh, empty sandbox that nothing has run in; ``take`` hands one out (or starts one
    when none is ready) and starts its replacement on a background thread. Each sandbox still
    serves exactly one episode. Spares are ordinary sandboxes: ``close`` (or the process's death)
    kills them. ``size`` 0 disables the pool (every ``take`` starts a sandbox)."""

    def __init__(self, limits: WorkspaceLimits, size: int = 1) -> None:
        if size < 0:
            raise ValueError(f"the spare pool's size must be >= 0, got {size}")
        self.limits = limits
        self.size = size
        self._ready: list[WorkspaceSandbox] = []
        self._lock = threading.Lock()
        self._filling = False
        self._closed = False
        self._refill()

    def take(self, files: Mapping[str, str | bytes] | None = None) -> WorkspaceSandbox:
        """A started sandbox holding ``files``."""
        with self._lock:
            if self._closed:
                raise WorkspaceError("the spare pool is closed")
            box = self._ready.pop() if self._ready else None
        try:
            if box is None or not box.alive:
                if box is not None:
                    box.close()
                return WorkspaceSandbox(self.limits, files)
            if files:
                try:
                    box.write_files(files)
                except BaseException:
                    box.close()
                    raise
            return box
        finally:
            self._refill()  # after the files: the replacement's start-up competes for the CPU

    def _refill(self) -> None:
        with self._lock:
            if self._closed or self._filling or len(self._ready) >= self.size:
                return
            self._filling = True
        threading.Thread(target=self._fill, name="agentgym-workspace-spares", daemon=True).start()

    def _fill(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed or len(self._ready) >= self.size:
                        return
                try:
                    box = WorkspaceSandbox(self.limits)
                except Exception as exc:  # noqa: BLE001 - take() starts one itself and raises what went wrong
                    logger.warning("a spare workspace sandbox failed to start (the next reset starts one): %s", exc)
                    return
                with self._lock:
                    if not self._closed:
                        self._ready.append(box)
                        continue
                box.close()
                return
        finally:
            with self._lock:
                self._filling = False

    def close(self) -> None:
        """Kill every spare; ``take`` fails afterwards."""
        with self._lock:
            self._closed = True
            spares, self._ready = self._ready, []
        for box in spares:
            box.close()
