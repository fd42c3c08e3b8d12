"""The weak mode: an in-process audit hook plus whatever OS limits the machine allows.

This is the sandbox agentgym had before the strong mode; it runs only when the user opts in
(``AGENTGYM_SANDBOX=weak``). It is a guard-rail for model-written code, not a boundary:

* **scratch directory**: a fresh temp dir is the child's cwd, ``HOME`` and ``TMPDIR``; deleted
  afterwards. ``python -I`` scrubs the environment; stdin is ``/dev/null``.
* **resource limits** (``setrlimit``): address space, CPU seconds, file size, open files, no cores.
* **wall-clock timeout**, process group killed after every run; ``PR_SET_PDEATHSIG``.
* **cgroups** where writable (root on cgroup v1): ``pids`` caps processes+threads and is emptied
  after the run, ``memory`` caps the run's total memory. Without the pids cgroup a non-root
  child gets ``RLIMIT_NPROC``; root gets no OS-level process cap.
* **network namespace** where root or unprivileged user namespaces allow it.
* **audit hook** (always): refuses sockets, starting processes, writes/deletes outside the
  scratch directory, ``ctypes`` library loading, raising limits, signalling other processes.

The hook runs inside the process it guards, so code can switch it off or go around it (the
abuse probes in ``tests/envs/tools/sandbox_abuse`` do: ``gc`` removes it, ``_posixsubprocess.fork_exec``
starts an unguarded process, ``dir_fd`` and ``sqlite3`` write where they like, ``ctypes`` reads
and writes memory). The child runs as the caller's user and can read whatever that user can.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from agentgym.envs.tools.sandbox.process import (
    SandboxResult,
    capped,
    forget_cgroups,
    libc,
    make_preexec,
    make_run_cgroups,
    make_run_dir,
    run_child,
    site_packages,
    snippet_limits,
    user_task_count,
)

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000

# Runs first in the child: install the audit hook, then execute the snippet as __main__.
# argv: [-c, snippet_path, scratch_dir, *site_packages_dirs]
BOOTSTRAP = r"""
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
                raise PermissionError(
                    f"sandbox: writing outside the scratch directory is not allowed "
                    f"({fsdecode(path)})"
                )
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and not inside(args[i]):
                    raise PermissionError(
                        f"sandbox: changing files outside the scratch directory is not "
                        f"allowed ({event})"
                    )
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
"""

_netns_lock = threading.Lock()
_netns_flags: int | None = None  # 0: unavailable


def probe_netns() -> int:
    """The unshare flags that give a child its own network namespace here, or 0."""
    global _netns_flags
    with _netns_lock:
        if _netns_flags is not None:
            return _netns_flags
        _netns_flags = 0
        if libc is not None and shutil.which("true"):
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
        if libc.unshare(flags) != 0:  # type: ignore[union-attr]
            raise OSError(ctypes.get_errno(), "unshare failed")

    return unshare


def run_weak(
    code: str,
    timeout_s: float,
    memory_mb: int,
    max_processes: int,
    max_output_bytes: int,
    max_file_mb: int,
    python: str | None,
    isolate_network: bool,
    use_cgroup: bool,
) -> SandboxResult:
    """Run ``code`` under the audit hook and the OS layers this machine allows (see the module doc)."""
    global _netns_flags
    start = time.perf_counter()
    limits = snippet_limits(memory_mb, timeout_s, max_file_mb)
    run_dir = make_run_dir()
    try:
        scratch = run_dir / "scratch"
        scratch.mkdir()
        snippet = run_dir / "main.py"
        snippet.write_text(code, encoding="utf-8")
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        if python is None:  # this interpreter: skip site's .pth processing (~20 ms), pass its site-packages
            argv = [
                sys.executable,
                "-I",
                "-B",
                "-S",
                "-u",
                "-X",
                "utf8",
                "-c",
                BOOTSTRAP,
                str(snippet),
                str(scratch),
                *site_packages(),
            ]
        else:
            argv = [python, "-I", "-B", "-u", "-X", "utf8", "-c", BOOTSTRAP, str(snippet), str(scratch)]
        while True:  # a layer that fails at start is switched off for this process and the start retried
            layers = ["scratch", "rlimits", "session", "audit"]
            run_limits = dict(limits)
            netns = probe_netns() if isolate_network else 0
            cgroups, cgroup_layers = make_run_cgroups(max_processes, memory_mb << 20) if use_cgroup else ([], [])
            layers += cgroup_layers
            if "cgroup" not in cgroup_layers and os.geteuid() != 0:
                run_limits.update(capped({resource.RLIMIT_NPROC: user_task_count(os.geteuid()) + max_processes}))
                layers.append("nproc")
            try:
                outcome = run_child(
                    argv,
                    cwd=scratch,
                    env=env,
                    stdin=None,
                    preexec=make_preexec(run_limits, [c.join for c in cgroups], netns),
                    cgroups=cgroups,
                    timeout_s=timeout_s,
                    max_output_bytes=max_output_bytes,
                )
            except subprocess.SubprocessError:  # a layer failed inside the child before exec
                if cgroups:
                    forget_cgroups()
                    continue
                if netns:
                    _netns_flags = 0
                    continue
                raise
            break
        layers += ["netns"] if netns else []
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return SandboxResult(
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        exit_code=outcome.returncode,
        timed_out=outcome.timed_out,
        seconds=time.perf_counter() - start,
        output_truncated=outcome.truncated,
        layers=layers,
        mode="weak",
    )
