"""Run a snippet of Python in a child process with limits, and always clean up after it.

What ``run_python`` does, layer by layer (each layer that the machine does not allow is
skipped, and ``SandboxResult.layers`` says which ones were on):

* **scratch directory** — a fresh temp dir is the child's cwd, ``HOME`` and ``TMPDIR``; it is
  deleted afterwards. The environment is scrubbed (``python -I``: no ``PYTHON*`` variables, no
  user site-packages); stdin is ``/dev/null``.
* **resource limits** (``setrlimit``) — address space (``RLIMIT_AS``: a 10 GB allocation fails
  with ``MemoryError``), CPU seconds (``RLIMIT_CPU``), file size (``RLIMIT_FSIZE``: output and
  scratch files), open files, no core dumps.
* **wall-clock timeout** — the child runs in its own session/process group; on timeout (and
  after every run) the whole group is SIGKILLed. The child is also SIGKILLed if the thread that
  started it dies (``PR_SET_PDEATHSIG``); run directories and cgroups left behind by a process
  that died mid-run are removed by the next process that runs a snippet.
* **pids cgroup** (``cgroup`` layer; needs a writable pids controller, e.g. root on cgroup v1)
  — caps processes+threads at ``max_processes`` even for root, for whom ``RLIMIT_NPROC`` is not
  enforced; after the run every task left in the cgroup is killed (this also catches children
  that escaped the process group) and the cgroup is removed. Without it, a non-root child gets
  ``RLIMIT_NPROC`` (this user's current tasks + ``max_processes``); root gets no OS-level process cap.
* **network namespace** (``netns`` layer; needs root or unprivileged user namespaces) — the
  child gets an empty network namespace: no interfaces but a downed loopback, so no network.
* **audit hook** (``audit`` layer, always) — a ``sys.addaudithook`` preamble refuses, with
  ``PermissionError``: creating sockets and name lookups; ``os.fork``/``exec``/``system``/
  ``posix_spawn``/``subprocess.Popen``; writes, deletes, renames, links, chmod/chown outside
  the scratch directory (``open`` in a write mode, ``os.remove``, ...); ``ctypes`` loading
  libraries or symbols; raising resource limits; signalling other processes.

What it does **not** protect against: this is a guard-rail for model-written code, not a
security boundary against hostile code. Audit hooks are bypassable from inside the process
(e.g. native extensions, ``_posixsubprocess.fork_exec``, memory tricks); reads are not
restricted (the child can read any file the parent user can, e.g. keys under ``/work``); when
the cgroup and netns layers are off, process count (as root) and network are only guarded by
the audit hook; the child runs as the same user as the parent; there is no seccomp filter, no
disk quota beyond ``RLIMIT_FSIZE`` per file, and no limit on /tmp-style world-writable paths at
the OS level. Run untrusted code in a container or VM.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1

# Runs first in the child: install the audit hook, then execute the snippet as __main__.
# argv: [-c, snippet_path, scratch_dir, *site_packages_dirs]
BOOTSTRAP = r'''
import os, sys
def _sandbox(scratch):
    import ctypes  # imported (and its libraries loaded) before the hook refuses dlopen
    scratch = os.path.realpath(scratch)
    me = os.getpid()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    refused = {
        "socket.__new__": "network access", "socket.connect": "network access", "socket.bind": "network access",
        "socket.getaddrinfo": "network access", "socket.gethostbyname": "network access",
        "socket.gethostbyaddr": "network access", "socket.sendto": "network access",
        "os.fork": "starting processes", "os.forkpty": "starting processes", "os.system": "starting processes",
        "os.exec": "starting processes", "os.posix_spawn": "starting processes", "os.spawn": "starting processes",
        "subprocess.Popen": "starting processes", "pty.spawn": "starting processes",
        "ctypes.dlopen": "loading native code", "ctypes.dlsym": "loading native code",
        "ctypes.dlsym/handle": "loading native code", "ctypes.cdata": "raw memory access",
        "resource.setrlimit": "changing resource limits", "resource.prlimit": "changing resource limits",
        "os.setxattr": "changing file attributes", "os.removexattr": "changing file attributes",
    }
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                   "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
                   "os.chown": (0,), "os.utime": (0,), "os.mkfifo": (0,), "os.mknod": (0,), "os.chflags": (0,),
                   "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.copyfile": (1,), "shutil.copytree": (1,)}
    ok_devices = {"/dev/null", "/dev/stdout", "/dev/stderr"}
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep

    def inside(path):
        if isinstance(path, int):
            return False
        raw = fsdecode(path)
        if raw in ok_devices:
            return True
        real = realpath(raw)
        return real == scratch or real.startswith(scratch + sep)

    def hook(event, args):
        why = refused.get(event)
        if why is not None:
            raise PermissionError(f"sandbox: {why} is not allowed ({event})")
        if event == "open":
            path, flags = args[0], args[2]
            if not isinstance(path, int) and flags & write_flags and not inside(path):
                raise PermissionError(f"sandbox: writing outside the scratch directory is not allowed ({fsdecode(path)})")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and not inside(args[i]):
                    raise PermissionError(f"sandbox: changing files outside the scratch directory is not allowed ({event})")
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, me):
            raise PermissionError(f"sandbox: signalling other processes is not allowed ({event})")

    sys.addaudithook(hook)

_path, _scratch = sys.argv[1], sys.argv[2]
sys.path.extend(sys.argv[3:])  # site-packages, added without running .pth files (python -S)
with open(_path, encoding="utf-8") as _f:
    _source = _f.read()
_sandbox(_scratch)
del _sandbox, _f
sys.argv = ["main.py"]
_code = compile(_source, "main.py", "exec")
del _path, _scratch, _source
try:
    exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _exc:  # the traceback without this bootstrap's frames
    import traceback
    _te = traceback.TracebackException(type(_exc), _exc, _exc.__traceback__.tb_next)
    _te.stack = traceback.StackSummary.from_list([f for f in _te.stack if f.filename != "<string>"])
    sys.stderr.write("".join(_te.format()))
    sys.exit(1)
'''


@dataclass
class SandboxResult:
    """What happened to one snippet."""

    stdout: str
    stderr: str
    exit_code: int | None  # None if killed for the timeout; negative: killed by that signal
    timed_out: bool
    seconds: float
    output_truncated: bool = False
    layers: list[str] = field(default_factory=list)  # isolation layers that were on

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


# ---- capabilities (probed once per process) ----------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_probe_lock = threading.Lock()
_netns_flags: int | None = None  # 0: unavailable
_cgroup_parent: str | None = None  # "": unavailable
_counter = itertools.count()
_stale_checked = False


def _probe_netns() -> int:
    """The unshare flags that give a child its own network namespace here, or 0."""
    global _netns_flags
    with _probe_lock:
        if _netns_flags is not None:
            return _netns_flags
        _netns_flags = 0
        if _libc is not None and shutil.which("true"):
            candidates = [CLONE_NEWNET] if os.geteuid() == 0 else [CLONE_NEWUSER | CLONE_NEWNET]
            for flags in candidates:
                try:
                    subprocess.run(["true"], preexec_fn=_unshare_fn(flags), check=True, timeout=10)
                    _netns_flags = flags
                    break
                except (subprocess.SubprocessError, OSError):
                    continue
        return _netns_flags


def _unshare_fn(flags: int) -> Callable[[], None]:
    def unshare() -> None:
        if _libc.unshare(flags) != 0:  # type: ignore[union-attr]
            raise OSError(ctypes.get_errno(), "unshare failed")

    return unshare


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path for ``controller`` (v1) or the unified one (v2), from /proc."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controller == "" and controllers == ""):
            return path
    return "/"


def _probe_cgroup() -> str:
    """A directory under which per-run pids cgroups can be made, or ""."""
    global _cgroup_parent
    with _probe_lock:
        if _cgroup_parent is not None:
            return _cgroup_parent
        _cgroup_parent = ""
        candidates = [Path("/sys/fs/cgroup/pids") / _own_cgroup("pids").lstrip("/"),
                      Path("/sys/fs/cgroup") / _own_cgroup("").lstrip("/")]
        for parent in candidates:
            _remove_stale(parent)
            probe = parent / f"agentgym-probe-{os.getpid()}"
            try:
                probe.mkdir()
            except OSError:
                continue
            try:
                if not (probe / "pids.max").exists():  # not a cgroup fs with pids (e.g. the tmpfs above v1)
                    raise OSError("no pids controller")
                (probe / "pids.max").write_text("8")
                (probe / "cgroup.procs").read_text()
                _cgroup_parent = str(parent)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    probe.rmdir()
            if _cgroup_parent:
                break
        return _cgroup_parent


def _remove_stale_run_dirs() -> None:
    """Delete run directories (``agentgym-py-<pid>-*`` in the temp dir) of processes that died
    mid-run; once per process."""
    global _stale_checked
    with _probe_lock:
        if _stale_checked:
            return
        _stale_checked = True
    with contextlib.suppress(OSError):
        for entry in Path(tempfile.gettempdir()).iterdir():
            match = re.fullmatch(r"agentgym-py-(\d+)-\w+", entry.name)
            if match and not Path(f"/proc/{match.group(1)}").exists():
                shutil.rmtree(entry, ignore_errors=True)


def _remove_stale(parent: Path) -> None:
    """Empty and remove run cgroups left by agentgym processes that died mid-run."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            match = re.fullmatch(r"agentgym-(?:probe-)?(\d+)(?:-\d+)?", entry.name)
            if match and entry.is_dir() and not Path(f"/proc/{match.group(1)}").exists():
                stale = _PidsCgroup.__new__(_PidsCgroup)
                stale.path, stale.procs = entry, str(entry / "cgroup.procs")
                stale.kill_all()
                stale.remove()


class _PidsCgroup:
    """A cgroup for one run: ``pids.max`` caps tasks; ``kill_all`` empties it; ``remove`` deletes it."""

    def __init__(self, parent: str, max_tasks: int) -> None:
        self.path = Path(parent) / f"agentgym-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(max_tasks))
        self.procs = str(self.path / "cgroup.procs")
        # The child joins by writing "0". On v1, joining through "tasks" moves one thread without
        # the thread-group lock "cgroup.procs" takes (an RCU sync: ~10-30 ms); the child is
        # single-threaded then, so it is the same move. v2 has only "cgroup.procs".
        tasks = self.path / "tasks"
        self.join = str(tasks) if tasks.exists() else self.procs

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in Path(self.procs).read_text().split()]
        except OSError:
            return []

    def kill_all(self, deadline_s: float = 2.0) -> None:
        end = time.monotonic() + deadline_s
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > end:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self) -> None:
        for _ in range(200):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)  # tasks still exiting


def _user_task_count(uid: int) -> int:
    """Tasks (processes and threads) of ``uid`` now: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


def _preexec(limits: dict[int, int], netns_flags: int, cgroup_join: str | None) -> Callable[[], None]:
    """Runs in the child between fork and exec: join the cgroup, unshare the network, set limits.
    (Everything it needs is resolved beforehand: no imports or allocations of note happen here.)"""
    setrlimit = resource.setrlimit
    unshare = _libc.unshare if _libc is not None else None
    prctl = _libc.prctl if _libc is not None else None
    parent = os.getpid()

    def preexec() -> None:
        if prctl is not None:  # die with the parent (thread), and don't start if it is already gone
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)
        if cgroup_join is not None:
            fd = os.open(cgroup_join, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if netns_flags and unshare is not None and unshare(netns_flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
        for which, value in limits.items():
            setrlimit(which, (value, value))

    return preexec


def _site_packages() -> list[str]:
    """This interpreter's site-packages directories (the venv's, then the base's)."""
    import site

    return [d for d in site.getsitepackages() if os.path.isdir(d)]


def _capped(limits: dict[int, int]) -> dict[int, int]:
    """Limits no higher than the hard limits already in force (only root may raise those)."""
    out = {}
    for which, value in limits.items():
        hard = resource.getrlimit(which)[1]
        out[which] = value if hard == resource.RLIM_INFINITY else min(value, hard)
    return out


def _start(argv: list[str], scratch: Path, env: dict[str, str], out: IO[bytes], err: IO[bytes], limits: dict[int, int],
           max_processes: int, isolate_network: bool, use_cgroup: bool,
           ) -> tuple[subprocess.Popen[bytes], _PidsCgroup | None, list[str]]:
    """Start the child with every isolation layer available; a layer that fails at start is
    switched off for this process and the start retried without it."""
    global _netns_flags, _cgroup_parent
    layers = ["scratch", "rlimits", "session", "audit"]
    limits = dict(limits)
    netns = _probe_netns() if isolate_network else 0
    cgroup: _PidsCgroup | None = None
    if use_cgroup and _probe_cgroup():
        with contextlib.suppress(OSError):
            cgroup = _PidsCgroup(_probe_cgroup(), max_processes)
    if cgroup is None and os.geteuid() != 0:
        limits.update(_capped({resource.RLIMIT_NPROC: _user_task_count(os.geteuid()) + max_processes}))
        layers.append("nproc")
    try:
        proc = subprocess.Popen(  # preexec_fn: needed for unshare and the cgroup
            argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True, close_fds=True,
            preexec_fn=_preexec(limits, netns, cgroup.join if cgroup else None),
        )
    except subprocess.SubprocessError:  # a layer failed inside the child before exec
        if cgroup is not None:
            cgroup.remove()
            _cgroup_parent = ""
            return _start(argv, scratch, env, out, err, limits, max_processes, isolate_network, False)
        if netns:
            _netns_flags = 0
            return _start(argv, scratch, env, out, err, limits, max_processes, False, False)
        raise
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    layers += (["cgroup"] if cgroup else []) + (["netns"] if netns else [])
    return proc, cgroup, layers


def _wait_unreaped(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the child to exit, without reaping it where the kernel allows
    (pidfd): while it is unreaped its pid, which is also its process group's id, cannot be
    reused, so killing the group afterwards cannot hit an unrelated process. True if it exited."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel): wait and reap
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (it leads its own session), then reap the child.
    The group is only signalled while the child is unreaped (see ``_wait_unreaped``)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_capped(path: Path, max_bytes: int) -> tuple[str, bool]:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            data = f.read(max_bytes)
    except OSError:
        return "", False
    return data.decode("utf-8", errors="replace"), size > max_bytes


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_processes: int = 16,
    max_output_bytes: int = 16_000,
    max_file_mb: int = 16,
    python: str | None = None,
    isolate_network: bool = True,
    use_cgroup: bool = True,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child Python and return its output.

    ``python`` is the interpreter (default: this one, with this environment's packages importable).
    ``timeout_s`` is wall-clock; ``memory_mb`` the address-space limit; ``max_processes`` the
    cap on processes+threads (cgroup, or ``RLIMIT_NPROC`` when not root); ``max_output_bytes``
    how much of stdout/stderr each is kept; ``max_file_mb`` the largest file (incl. output) the
    child may write. Never leaves a process or the scratch directory behind.
    """
    start = time.perf_counter()
    limits = _capped({
        resource.RLIMIT_AS: memory_mb << 20,
        resource.RLIMIT_CPU: math.ceil(timeout_s) + 1,
        resource.RLIMIT_FSIZE: max_file_mb << 20,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_CORE: 0,
    })
    _remove_stale_run_dirs()
    timed_out = False
    with contextlib.ExitStack() as cleanup:  # runs every step, in reverse order, even if one fails
        run_dir = Path(tempfile.mkdtemp(prefix=f"agentgym-py-{os.getpid()}-"))
        cleanup.callback(shutil.rmtree, run_dir, ignore_errors=True)
        scratch = run_dir / "scratch"
        scratch.mkdir()
        snippet = run_dir / "main.py"
        snippet.write_text(code, encoding="utf-8")
        out_path, err_path = run_dir / "stdout", run_dir / "stderr"
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch),
            "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        }
        if python is None:  # this interpreter: skip site's .pth processing (~20 ms), pass its site-packages
            argv = [sys.executable, "-I", "-B", "-S", "-u", "-X", "utf8", "-c", BOOTSTRAP, str(snippet), str(scratch),
                    *_site_packages()]
        else:
            argv = [python, "-I", "-B", "-u", "-X", "utf8", "-c", BOOTSTRAP, str(snippet), str(scratch)]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc, cgroup, layers = _start(argv, scratch, env, out, err, limits, max_processes, isolate_network, use_cgroup)
        if cgroup is not None:
            cleanup.callback(cgroup.remove)
            cleanup.callback(cgroup.kill_all)
        cleanup.callback(_kill_session, proc)
        timed_out = not _wait_unreaped(proc, timeout_s)
        _kill_session(proc)  # the timed-out child and any stragglers in its session
        if cgroup is not None:
            cgroup.kill_all()  # and any that left the session
        stdout, out_cut = _read_capped(out_path, max_output_bytes)
        stderr, err_cut = _read_capped(err_path, max_output_bytes)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        seconds=time.perf_counter() - start,
        output_truncated=out_cut or err_cut,
        layers=layers,
    )
