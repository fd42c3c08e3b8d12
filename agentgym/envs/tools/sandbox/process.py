"""Starting, limiting, waiting for and cleaning up after the sandbox's child process.

Shared by both sandbox modes: resource limits set between fork and exec, per-run cgroups
(``pids`` caps processes+threads, ``memory`` caps all of the run's memory), the wall-clock
timeout, killing the whole process group and every task left in the cgroups, reading capped
output back, and removing run directories / cgroups that a process which died mid-run left.

The child's output goes to files with no name (``O_TMPFILE``): they vanish with the last process
holding them, so a caller killed mid-run leaves no output behind. (The weak mode's scratch
directory needs a name; a later agentgym process removes one whose owner died.)
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

PR_SET_PDEATHSIG = 1
RUN_DIR_PREFIX = "agentgym-py-"

libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_probe_lock = threading.Lock()
_counter = itertools.count()
_stale_checked = False


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
    mode: str = ""  # "strong" or "weak"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


# ---- cgroups ------------------------------------------------------------------------------
# The file that caps each controller: cgroup v1 name first, then v2.
LIMIT_FILES = {"pids": ("pids.max",), "memory": ("memory.limit_in_bytes", "memory.max")}
_cgroup_parents: dict[str, tuple[Path, str] | None] = {}


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path for ``controller`` (v1) or the unified one (v2, ``""``), from /proc."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controller == "" and controllers == ""):
            return path
    return "/"


def probe_cgroup(controller: str) -> tuple[Path, str] | None:
    """``(parent directory, limit file)`` under which per-run ``controller`` cgroups can be made
    here (root on cgroup v1, or a delegated v2 subtree), or None. Probed once per process."""
    with _probe_lock:
        if controller in _cgroup_parents:
            return _cgroup_parents[controller]
        _cgroup_parents[controller] = None
        v2 = _own_cgroup("").lstrip("/")
        candidates = [
            Path("/sys/fs/cgroup") / controller / _own_cgroup(controller).lstrip("/"),
            Path("/sys/fs/cgroup") / v2,
            Path("/sys/fs/cgroup/unified") / v2,
        ]
        for parent in candidates:
            remove_stale_cgroups(parent)
            probe = parent / f"agentgym-probe-{os.getpid()}"
            try:
                probe.mkdir()
            except OSError:
                continue
            try:
                # a cgroup fs with this controller (not e.g. the tmpfs above the v1 hierarchies)
                limit_file = next((f for f in LIMIT_FILES[controller] if (probe / f).exists()), None)
                if limit_file is None:
                    raise OSError(f"no {controller} controller")
                (probe / limit_file).write_text(str(1 << 30) if controller == "memory" else "8")
                (probe / "cgroup.procs").read_text()
                _cgroup_parents[controller] = (parent, limit_file)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    probe.rmdir()
            if _cgroup_parents[controller]:
                break
        return _cgroup_parents[controller]


def forget_cgroups() -> None:
    """Stop making cgroups in this process (joining one failed in a child)."""
    with _probe_lock:
        for controller in LIMIT_FILES:
            _cgroup_parents[controller] = None


def remove_stale_cgroups(parent: Path) -> None:
    """Empty and remove run cgroups left by agentgym processes that died mid-run."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            match = re.fullmatch(r"agentgym-(?:probe-)?(\d+)(?:-\d+)?", entry.name)
            if match and entry.is_dir() and not Path(f"/proc/{match.group(1)}").exists():
                stale = RunCgroup.__new__(RunCgroup)
                stale.path, stale.procs = entry, str(entry / "cgroup.procs")
                stale.kill_all()
                stale.remove()


class RunCgroup:
    """A cgroup for one run: ``limits`` ({file: value}) are written at creation; the child joins
    by writing "0" to ``join``; ``kill_all`` empties it; ``remove`` deletes it."""

    def __init__(self, parent: Path, limits: dict[str, str]) -> None:
        self.path = Path(parent) / f"agentgym-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        self.procs = str(self.path / "cgroup.procs")
        try:
            for name, value in limits.items():
                (self.path / name).write_text(value)
        except OSError:
            self.remove()
            raise
        # On v1, joining through "tasks" moves one thread without the thread-group lock
        # "cgroup.procs" takes (an RCU sync: ~10-30 ms); the child is single-threaded then, so it
        # is the same move. v2 has only "cgroup.procs".
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


def make_run_cgroups(max_tasks: int | None, memory_bytes: int | None) -> tuple[list[RunCgroup], list[str]]:
    """The cgroups for one run (one per hierarchy: v1 has one per controller, v2 one for all)
    and the layer names they provide (``cgroup`` for pids, ``memory-cgroup``)."""
    wanted = {"pids": max_tasks, "memory": memory_bytes}
    by_parent: dict[Path, dict[str, str]] = {}
    layers = []
    for controller, value in wanted.items():
        found = probe_cgroup(controller) if value is not None else None
        if found is None:
            continue
        parent, limit_file = found
        limits = by_parent.setdefault(parent, {})
        limits[limit_file] = str(value)
        if limit_file == "memory.limit_in_bytes":  # v1: swap may not extend the limit
            limits["memory.memsw.limit_in_bytes"] = str(value)
        layers.append("cgroup" if controller == "pids" else "memory-cgroup")
    cgroups: list[RunCgroup] = []
    for parent, limits in by_parent.items():
        try:
            cgroups.append(RunCgroup(parent, limits))
        except OSError:
            if "memory.memsw.limit_in_bytes" in limits:  # no swap accounting: the RAM limit alone
                limits.pop("memory.memsw.limit_in_bytes")
                with contextlib.suppress(OSError):
                    cgroups.append(RunCgroup(parent, limits))
                    continue
            for cgroup in cgroups:
                cgroup.remove()
            return [], []
    return cgroups, layers


def user_task_count(uid: int) -> int:
    """Tasks (processes and threads) of ``uid`` now: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


# ---- starting the child --------------------------------------------------------------------
def site_packages() -> list[str]:
    """This interpreter's site-packages directories (the venv's, then the base's)."""
    import site

    return [d for d in site.getsitepackages() if os.path.isdir(d)]


def capped(limits: dict[int, int]) -> dict[int, int]:
    """Limits no higher than the hard limits already in force (only root may raise those)."""
    out = {}
    for which, value in limits.items():
        hard = resource.getrlimit(which)[1]
        out[which] = value if hard == resource.RLIM_INFINITY else min(value, hard)
    return out


def snippet_limits(memory_mb: int, timeout_s: float, max_file_mb: int) -> dict[int, int]:
    """The resource limits every sandboxed snippet runs under, whichever sandbox runs it (capped)."""
    return capped(
        {
            resource.RLIMIT_AS: memory_mb << 20,
            resource.RLIMIT_CPU: math.ceil(timeout_s) + 1,
            resource.RLIMIT_FSIZE: max_file_mb << 20,
            resource.RLIMIT_NOFILE: 256,
            resource.RLIMIT_CORE: 0,
            resource.RLIMIT_RTPRIO: 0,  # no real-time scheduling, whatever the caller was allowed
            resource.RLIMIT_NICE: 0,  # no raising its own priority
        }
    )


def make_preexec(limits: dict[int, int], cgroup_joins: list[str], unshare_flags: int = 0) -> Callable[[], None]:
    """Runs in the child between fork and exec: die with the parent, join the cgroups, unshare
    namespaces, set limits. (Everything it needs is resolved beforehand: no imports or
    allocations of note happen here.)"""
    setrlimit = resource.setrlimit
    unshare = libc.unshare if libc is not None else None
    prctl = libc.prctl if libc is not None else None
    parent = os.getpid()

    def preexec() -> None:
        if prctl is not None:  # die with the parent (thread), and don't start if it is already gone
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)
        for join in cgroup_joins:
            fd = os.open(join, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if unshare_flags and unshare is not None and unshare(unshare_flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare failed")
        for which, value in limits.items():
            setrlimit(which, (value, value))

    return preexec


def wait_unreaped(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
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


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (it leads its own session), then reap the child.
    The group is only signalled while the child is unreaped (see ``wait_unreaped``)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_capped(file: IO[bytes], max_bytes: int) -> tuple[str, bool]:
    """The first ``max_bytes`` of an output file (decoded), and whether there was more."""
    try:
        size = os.fstat(file.fileno()).st_size
        file.seek(0)
        data = file.read(max_bytes)
    except OSError:
        return "", False
    return data.decode("utf-8", errors="replace"), size > max_bytes


def make_run_dir() -> Path:
    """A fresh private directory for one run's named files on this side (the weak mode's scratch
    directory and snippet)."""
    remove_stale_run_dirs()
    return Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))


def remove_stale_run_dirs() -> None:
    """Delete run directories (``agentgym-py-<pid>-*`` in the temp dir) of processes that died
    mid-run; once per process."""
    global _stale_checked
    with _probe_lock:
        if _stale_checked:
            return
        _stale_checked = True
    with contextlib.suppress(OSError):
        for entry in Path(tempfile.gettempdir()).iterdir():
            match = re.fullmatch(re.escape(RUN_DIR_PREFIX) + r"(\d+)-\w+", entry.name)
            if match and not Path(f"/proc/{match.group(1)}").exists():
                shutil.rmtree(entry, ignore_errors=True)


@dataclass
class Outcome:
    """The raw end of a child: its return code (None on timeout) and capped output."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    truncated: bool


def run_child(
    argv: list[str],
    *,
    cwd: str | Path,
    env: dict[str, str],
    stdin: int | IO[bytes] | None,
    preexec: Callable[[], None],
    cgroups: list[RunCgroup],
    timeout_s: float,
    max_output_bytes: int,
    pass_fds: tuple[int, ...] = (),
) -> Outcome:
    """Start ``argv`` in its own session with ``preexec``, wait up to ``timeout_s``, then kill its
    process group and every task left in ``cgroups``; its output is read back from nameless files
    in the temp directory. The cgroups are removed afterwards. Raises ``subprocess.SubprocessError``
    if the preexec step failed in the child (nothing was started)."""
    with contextlib.ExitStack() as cleanup:  # runs every step, in reverse order, even if one fails
        out = cleanup.enter_context(tempfile.TemporaryFile(prefix=RUN_DIR_PREFIX))
        err = cleanup.enter_context(tempfile.TemporaryFile(prefix=RUN_DIR_PREFIX))
        for cgroup in cgroups:
            cleanup.callback(cgroup.remove)
            cleanup.callback(cgroup.kill_all)
        proc = subprocess.Popen(  # preexec_fn: needed for the cgroups, limits and unshare
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
            preexec_fn=preexec,
        )
        cleanup.callback(kill_session, proc)
        timed_out = not wait_unreaped(proc, timeout_s)
        kill_session(proc)  # the timed-out child and any stragglers in its session
        for cgroup in cgroups:
            cgroup.kill_all()  # and any that left the session
        stdout, out_cut = read_capped(out, max_output_bytes)
        stderr, err_cut = read_capped(err, max_output_bytes)
    return Outcome(None if timed_out else proc.returncode, timed_out, stdout, stderr, out_cut or err_cut)
