"""Regression tests for ways out of the workspace sandbox found by an independent escape probe (issue 33).

Each test plays the hostile agent through the sandbox's own calls and fails if the way out reopens."""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from agentgym.envs.workspace import sandbox as sandbox_module
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


def test_without_a_system_python_the_host_interpreters_packages_and_venv_are_not_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's fallback interpreter is bound read-only, but not its packages, nor a virtual
    environment (which on a training host can hold a task suite's hidden tests) nor the project."""
    monkeypatch.setattr(sandbox_module, "SERVER_PYTHON", "/nonexistent/python3")
    packages = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    private = sorted(p for p in packages if p and os.path.isdir(p) and not p.startswith("/usr/"))
    if not private:
        pytest.skip("this interpreter keeps its packages under /usr (bound anyway, documented)")
    project = str(Path(__file__).resolve().parents[3])
    listing = " ".join(f"'{p}'" for p in [*private, sys.prefix, project])
    with WorkspaceSandbox(LIMITS) as box:
        result = box.run(f'for p in {listing}; do ls -A "$p" 2>/dev/null | head -3 | sed "s|^|$p: |"; done')
        assert result.output == "", f"host directories are visible in the sandbox:\n{result.output}"
        assert box.run("echo alive").output == "alive\n"


def test_git_works_in_the_workspace_root(box: WorkspaceSandbox) -> None:
    """As root, /workspace is a tmpfs owned by root while commands run as nobody: git refused the
    repository ("dubious ownership") unless the workspace is marked safe."""
    commit = "git -c user.name=a -c user.email=a@b commit -qm x --allow-empty"
    result = box.run(f"git init -q . && git status --short && {commit}")
    assert result.ok, result.output


# Every descriptor of every other process in the sandbox that the agent can open for writing. Before
# the server became pid 1, bwrap's init held the host's pipes; as a non-root user it ran as the
# sandbox's uid and was dumpable, so /proc/1/fd/1 let code write the host forged replies.
OPEN_OTHERS = r"""python3 - <<'PY'
import os
me = {os.getpid(), os.getppid()}
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    if pid in me:
        continue
    for fd in fds:
        try:
            os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
            print("opened", pid, fd, os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
print("pid1", open("/proc/1/comm").read().strip())
PY"""


def test_no_process_in_the_sandbox_lends_the_agent_the_hosts_pipes(box: WorkspaceSandbox) -> None:
    result = box.run(OPEN_OTHERS)
    assert "opened" not in result.output, result.output
    # the server itself is pid 1 (non-dumpable): no bwrap init holds the host's pipes in there
    assert result.output.strip().endswith("pid1 python3"), result.output


def test_orphans_are_reaped_during_a_call() -> None:
    """The server is the namespace's init, so orphaned processes become its children: it must reap them
    as they exit, or their zombies fill the process limit within one call."""
    with WorkspaceSandbox(WorkspaceLimits(timeout_s=20.0, max_processes=32)) as box:
        result = box.run("for i in $(seq 150); do (true &); done; echo done")
        assert result.ok and result.output == "done\n", result.output[-500:]
