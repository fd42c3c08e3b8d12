"""Regression tests for ways out of the workspace sandbox found by an independent escape probe (issue 33).

Each test plays the hostile agent through the sandbox's own calls and fails if the way out reopens."""

from __future__ import annotations

import time

import pytest

from agentgym.envs.workspace.sandbox import WorkspaceLimits, WorkspaceSandbox

LIMITS = WorkspaceLimits(timeout_s=5.0, memory_mb=512, max_processes=32, max_output_bytes=4000, max_disk_mb=16)


@pytest.fixture
def box() -> WorkspaceSandbox:
    sandbox = WorkspaceSandbox(LIMITS)
    yield sandbox
    sandbox.close()


# A process whose main thread ends with SYS_exit (not exit_group) shows as a zombie ("Z") in
# /proc/<pid>/stat while its other threads run on.
ZOMBIE_LEADER = r"""
cat > /tmp/zl.py <<'PY'
import ctypes, threading, time
def tick():
    while True:
        with open("/workspace/ticks", "a") as f:
            f.write("x\n")
        time.sleep(0.05)
threading.Thread(target=tick).start()
time.sleep(0.1)
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: only the main thread ends
PY
setsid python3 /tmp/zl.py </dev/null >/dev/null 2>&1 &
sleep 0.5
"""


def test_a_process_whose_main_thread_exited_does_not_outlive_its_call(box: WorkspaceSandbox) -> None:
    assert box.run(ZOMBIE_LEADER).ok
    before = box.read("ticks").data.count(b"\n")
    time.sleep(0.5)
    after = box.read("ticks").data.count(b"\n")
    assert after == before, f"a thread of the agent's kept running between calls ({before} -> {after} ticks)"
    listing = box.run("cat /proc/[0-9]*/task/*/comm").output
    assert "python3" in listing  # the server
    assert listing.count("python3") == 1, listing


def test_writing_to_a_fifo_is_refused_without_hanging_the_server(box: WorkspaceSandbox) -> None:
    assert box.run("mkfifo pipe").ok
    start = time.monotonic()
    with pytest.raises(ValueError, match="not a regular file"):
        box.write("pipe", "x")
    assert time.monotonic() - start < 5.0
    assert box.run("echo alive").output == "alive\n"  # the episode goes on
