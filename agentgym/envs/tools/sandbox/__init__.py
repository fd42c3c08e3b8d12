"""Run a snippet of Python in a child process with limits, and always clean up after it.

Two modes, chosen by ``run_python(mode=...)``, else the ``AGENTGYM_SANDBOX`` environment variable
(``strong``, the default, or ``weak``):

**strong** (``bubblewrap.py``) — an isolation boundary built by the kernel. Needs bubblewrap
(``bwrap``) and, as root, ``setpriv``; where it cannot start, ``run_python`` and the python tool
raise ``SandboxUnavailable`` saying what is missing instead of quietly running weaker. Guaranteed:

* **user**: as root, the code runs as uid/gid 65534 (``nobody``) with no supplementary groups, no
  capabilities and no_new_privs (setuid binaries give nothing). As another user it keeps that
  user's uid inside a user namespace and cannot make another one.
* **files**: a new mount namespace whose root is read-only and holds only ``/usr`` (+ the
  ``/bin``, ``/lib*`` links), a few harmless ``/etc`` files (``ld.so.cache``, ``passwd``, ...), the
  interpreter's own directories (prefix, venv, site-packages) read-only, a private ``/proc`` and a
  minimal ``/dev``. ``/tmp`` (the working directory and ``HOME``) and ``/dev/shm`` are private tmpfs
  mounts of ``max_disk_mb`` each, gone when the call ends. Nothing else of the host exists there:
  not ``/root``, ``/home``, ``/work``, ``/run``, ``/var``, ``/sys``, the host's ``/tmp`` or its sockets.
* **processes**: a new PID namespace: the code sees only its own processes, cannot signal or
  trace anything outside, and every process in it is killed when the call ends (also on timeout,
  or when the caller dies), daemonized or not. Its own session (no terminal injection).
* **network**: a new network namespace with only a loopback: no network, not even the host's
  localhost. Also private System V IPC and hostname.
* **limits**: wall-clock ``timeout_s``; CPU seconds (``RLIMIT_CPU``); address space per process
  ``memory_mb`` (``RLIMIT_AS``); file size ``max_file_mb`` (incl. stdout/stderr); 256 open files;
  processes+threads ``max_processes`` (pids cgroup, else ``RLIMIT_NPROC``); where a memory cgroup
  can be made, all of the call's memory, tmpfs files included, below ``memory_mb + 2*max_disk_mb``;
  no real-time scheduling and no raised priority (``RLIMIT_RTPRIO``/``RLIMIT_NICE`` 0).
* **system calls** (x86_64): a seccomp filter refuses namespaces, mounts, keyrings, bpf,
  perf_event_open, userfaultfd, io_uring, ptrace, process_vm_*, file handles, kernel modules, and
  sockets of any family but ``AF_UNIX`` (``AF_VSOCK``, which no namespace covers, among them).
* **host files**: the call's output is kept in files with no name on this side, so nothing is
  left behind even when the caller is killed mid-call.

Not protected against: reading what is mounted (the interpreter's files, ``/usr``), bugs in the
kernel itself (the filter narrows its surface), CPU and memory-bandwidth contention with the host.
``SandboxResult.layers`` lists the layers that were on (``cgroup``, ``memory-cgroup``,
``seccomp`` depend on the machine).

**weak** (``guardrail.py``, opt-in with ``AGENTGYM_SANDBOX=weak`` or ``mode="weak"``) — the
in-process audit hook, resource limits, process-group kill, and cgroups and a network namespace
where the machine allows. A guard-rail against accidents in model-written code, not a boundary:
code that means to can switch the hook off and then read, write, delete or signal anything the
caller's user can (see ``tests/envs/tools/sandbox_abuse``).
"""

from __future__ import annotations

import logging
import os

from agentgym.envs.tools.sandbox.bubblewrap import (
    SandboxUnavailable,
    require_strong,
    run_strong,
    strong_problem,
)
from agentgym.envs.tools.sandbox.guardrail import run_weak
from agentgym.envs.tools.sandbox.process import SandboxResult

MODE_ENV = "AGENTGYM_SANDBOX"
MODES = ("strong", "weak")
logger = logging.getLogger(__name__)
_warned_weak = False


def resolve_mode(mode: str | None = None) -> str:
    """``mode`` if given, else ``$AGENTGYM_SANDBOX``, else ``"strong"``; checked against ``MODES``."""
    chosen = (mode or os.environ.get(MODE_ENV) or "strong").strip().lower()
    if chosen not in MODES:
        raise ValueError(
            f"unknown sandbox mode {chosen!r} (from {'the argument' if mode else MODE_ENV}); "
            f"use one of {', '.join(MODES)}"
        )
    return chosen


def check_mode(mode: str | None = None) -> str:
    """The mode that will run, after saying loudly what it means: raises ``SandboxUnavailable``
    (and logs it) if the strong mode is asked for and cannot run here; warns once per process
    when the weak mode is chosen."""
    global _warned_weak
    chosen = resolve_mode(mode)
    if chosen == "strong":
        try:
            require_strong()
        except SandboxUnavailable as exc:
            logger.error("%s", exc)
            raise
    elif not _warned_weak:
        _warned_weak = True
        logger.warning(
            "The Python tool runs in the WEAK sandbox (%s=weak): an in-process guard-rail, not an "
            "isolation boundary; code that means to can read, write and signal as this user (uid %d).",
            MODE_ENV,
            os.geteuid(),
        )
    return chosen


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
    max_disk_mb: int = 64,
    mode: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child Python and return its output.

    ``mode``: ``"strong"`` or ``"weak"`` (default: ``$AGENTGYM_SANDBOX``, else strong; strong raises
    ``SandboxUnavailable`` where it cannot run). ``python`` is the interpreter (default: this one,
    with this environment's packages importable). ``timeout_s`` is wall-clock; ``memory_mb`` the
    address-space limit per process; ``max_processes`` the cap on processes+threads;
    ``max_output_bytes`` how much of stdout/stderr each is kept; ``max_file_mb`` the largest file
    (incl. output) the child may write; ``max_disk_mb`` the size of the strong mode's ``/tmp`` and
    ``/dev/shm``. ``isolate_network`` (weak mode only: the strong mode always has no network) and
    ``use_cgroup`` switch those layers off. Never leaves a process or a file behind.
    """
    if resolve_mode(mode) == "strong":
        require_strong()
        return run_strong(
            code,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_output_bytes=max_output_bytes,
            max_file_mb=max_file_mb,
            max_disk_mb=max_disk_mb,
            python=python,
            use_cgroup=use_cgroup,
        )
    return run_weak(
        code,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_processes=max_processes,
        max_output_bytes=max_output_bytes,
        max_file_mb=max_file_mb,
        python=python,
        isolate_network=isolate_network,
        use_cgroup=use_cgroup,
    )


__all__ = [
    "MODES",
    "MODE_ENV",
    "SandboxResult",
    "SandboxUnavailable",
    "check_mode",
    "resolve_mode",
    "run_python",
    "strong_problem",
]
