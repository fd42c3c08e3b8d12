"""Abuse probes for the Python tool's sandbox: each test runs hostile code through the tool in
its default (strong) mode and then checks, from the host side, that it did not get out.

The probes are written against the sandbox's promise, not its implementation, so they also run
against the old in-process guard-rail (most of them go around its audit hook first) - see the
summary in ``test_probes.py``. They skip, saying why, where the strong sandbox cannot run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import agentgym
from agentgym.envs.tools import sandbox as sandbox_module
from agentgym.envs.tools.python import PythonTool

PROBE_TIMEOUT_S = 6.0
PROBE_MEMORY_MB = 512
PROJECT_DIR = Path(agentgym.__file__).resolve().parents[1]

# Starts a process without subprocess/os.fork, which the weak mode's audit hook refuses (the
# review's `_posixsubprocess.fork_exec` escape); under the strong mode it is just another spawn.
SPAWN = r"""
import os, sys, _posixsubprocess
def spawn(argv, env=None, setsid=False):
    errpipe_read, errpipe_write = os.pipe()
    args = [os.fsencode(a) for a in argv]
    env_list = None if env is None else [os.fsencode(f"{k}={v}") for k, v in env.items()]
    assert sys.version_info[:2] >= (3, 11), "fork_exec's signature differs before 3.11"
    pid = _posixsubprocess.fork_exec(args, [args[0]], True, (errpipe_write,), None, env_list, -1, -1, -1, -1, -1, -1,
                                     errpipe_read, errpipe_write, True, setsid, -1, None, None, None, -1, None, False)
    os.close(errpipe_write)
    failed = os.read(errpipe_read, 200)
    os.close(errpipe_read)
    if failed:
        raise OSError(failed.decode(errors="replace"))
    return pid
"""


def probe(body: str, spawn: bool = False, **values: object) -> str:
    """The probe's code: ``body`` (dedented) with ``{name}`` placeholders filled by ``repr(value)``."""
    code = textwrap.dedent(body).format(**{k: repr(v) for k, v in values.items()})
    return (SPAWN + code) if spawn else code


@pytest.fixture
def strong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool's default mode, the strong one; skip where it cannot run here."""
    monkeypatch.setenv("AGENTGYM_SANDBOX", "strong")
    problem = getattr(sandbox_module, "strong_problem", lambda: None)()  # (the old sandbox had no modes)
    if problem is not None:
        pytest.skip(f"the strong sandbox cannot run here: {problem}")


@pytest.fixture
def run_code(strong: None) -> Callable[[str], object]:
    """Run code through the python tool as a user gets it by default (the strong mode)."""
    return PythonTool(timeout_s=PROBE_TIMEOUT_S, memory_mb=PROBE_MEMORY_MB, max_output_chars=20_000).run


PARENT = r"""
import os, sys
from agentgym.envs.tools.python import PythonTool
secret = "".join(reversed(os.environ["PROBE_SECRET_REVERSED"]))  # built at run time: only in this heap
code = sys.stdin.read().replace("PARENT_PID", str(os.getpid()))
result = PythonTool(timeout_s={timeout}, memory_mb={memory}, max_output_chars=20000).run(code)
print(result.stdout)
print(result.stderr)
print("parent survived", len(secret))
"""


def run_in_throwaway_parent(code: str, secret: str = "", env_secret: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``code`` through the tool from a separate Python process (so a probe that kills its parent
    kills that process, not pytest). The parent holds ``secret`` in its heap only and ``env_secret``
    in its environment; ``PARENT_PID`` in ``code`` becomes its pid."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_DIR),
        "AGENTGYM_SANDBOX": "strong",
        "PROBE_SECRET_REVERSED": secret[::-1],
        "PROBE_ENV_SECRET": env_secret,
    }
    script = PARENT.format(timeout=PROBE_TIMEOUT_S, memory=PROBE_MEMORY_MB)
    return subprocess.run(
        [sys.executable, "-c", script], input=code, env=env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60
    )


def processes_with(mark: str, wait_s: float = 1.0) -> list[psutil.Process]:
    """Live processes whose command line holds ``mark``, after giving the kernel ``wait_s`` to
    finish off a dying sandbox."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if mark in " ".join(proc.info["cmdline"] or ()) and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
