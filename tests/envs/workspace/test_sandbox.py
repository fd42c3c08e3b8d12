"""The episode sandbox's promises, checked from the host side: state persists across calls, every call
is bounded, nothing outlives the episode (close, the caller killed), and the ways out are shut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentgym.envs.tools.sandbox import SandboxUnavailable
from agentgym.envs.workspace import sandbox as sandbox_module
from agentgym.envs.workspace.sandbox import WorkspaceLimits, WorkspaceSandbox

PROJECT_DIR = Path(__file__).resolve().parents[3]
LIMITS = WorkspaceLimits(timeout_s=5.0, memory_mb=512, max_processes=32, max_output_bytes=4000, max_disk_mb=16)


@pytest.fixture
def box() -> WorkspaceSandbox:
    sandbox = WorkspaceSandbox(LIMITS, {"src/app.py": "print('hello')\n", "README": "readme\n"})
    yield sandbox
    sandbox.close()


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: list[int], wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not [p for p in pids if running(p)]:
            return True
        time.sleep(0.05)
    return False


# ---- state across calls ---------------------------------------------------------------------------
def test_files_and_the_working_directory_persist_across_calls(box: WorkspaceSandbox) -> None:
    assert box.run("cat src/app.py").output == "print('hello')\n"
    assert box.run("echo made > made.txt && mkdir -p deep/er").ok
    assert box.run("cat made.txt").output == "made\n"
    assert box.read("made.txt").data == b"made\n"
    assert box.run("cd deep/er").cwd == "/workspace/deep/er"
    assert box.run("pwd").output == "/workspace/deep/er\n"
    assert box.run("python3 /workspace/src/app.py").output == "hello\n"
    box.write("deep/er/w.txt", "written")
    assert box.run("cat w.txt").output == "written"


def test_tools_of_the_image_work(box: WorkspaceSandbox) -> None:
    result = box.run("grep -rn hello . | sed 's/hello/HELLO/' && find . -name '*.py' | sort && id -u && git --version")
    assert result.ok, result.output
    assert "HELLO" in result.output and "./src/app.py" in result.output
    if os.geteuid() == 0:
        assert "\n65534\n" in result.output  # nobody, not root


def test_the_exit_code_and_merged_output_come_back(box: WorkspaceSandbox) -> None:
    result = box.run("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3 and "out\n" in result.output and "err\n" in result.output


# ---- bounds ---------------------------------------------------------------------------------------
def test_a_call_is_stopped_at_its_timeout(box: WorkspaceSandbox) -> None:
    start = time.perf_counter()
    result = box.run("echo started; sleep 60", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None and "started" in result.output
    assert time.perf_counter() - start < 3.5  # the timeout, the kill sweep, a loaded machine's slack
    assert box.run("echo still here").output == "still here\n"  # the episode goes on


def test_output_is_capped_and_a_flood_does_not_block(box: WorkspaceSandbox) -> None:
    start = time.perf_counter()
    result = box.run("yes 0123456789 | head -c 5000000")  # 1250 times the cap
    assert result.ok and result.truncated and len(result.output.encode()) <= LIMITS.max_output_bytes
    assert time.perf_counter() - start < LIMITS.timeout_s


def test_background_processes_do_not_outlive_their_call(box: WorkspaceSandbox) -> None:
    assert box.pid is not None
    box.run("sleep 300 & setsid sleep 301 & (sleep 302 &) ; nohup sleep 303 >/dev/null 2>&1 &")
    alive = []
    for proc in descendants(box.pid):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:  # a zombie is dead, waiting for init to reap it
                alive.append(proc.name())
        except psutil.NoSuchProcess:
            continue
    assert alive == ["python3"]  # the server (pid 1 inside)


def test_the_workspace_is_size_capped(box: WorkspaceSandbox) -> None:
    result = box.run("dd if=/dev/zero of=big bs=1M count=64 2>&1; df -m /workspace | tail -1")
    assert "No space left" in result.output or "File too large" in result.output
    assert int(box.run("du -sm /workspace | cut -f1").output) <= LIMITS.max_disk_mb


def test_memory_and_processes_are_capped(box: WorkspaceSandbox) -> None:
    result = box.run("python3 -c 'b = bytearray(2 << 30)' 2>&1 | tail -1")
    assert "MemoryError" in result.output
    fork = (
        "import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError as e:\n"
        "        print('forks', n, e.strerror, flush=True)\n        break\n    if pid == 0:\n"
        "        time.sleep(10)\n        os._exit(0)\n    n += 1\n"
    )
    box.write("fork.py", fork)
    result = box.run("python3 fork.py")
    assert "Resource temporarily unavailable" in result.output, result.output
    assert int(result.output.split()[1]) < LIMITS.max_processes
    assert box.run("echo after").output == "after\n"  # the next call starts clean


# ---- lifetime -------------------------------------------------------------------------------------
def test_close_kills_every_process_of_the_episode() -> None:
    sandbox = WorkspaceSandbox(LIMITS)
    assert sandbox.pid is not None
    pids = [sandbox.pid, *(p.pid for p in descendants(sandbox.pid))]
    assert len(pids) >= 2  # bwrap, the server
    sandbox.close()
    assert gone(pids) and not sandbox.alive
    with pytest.raises(sandbox_module.WorkspaceError):
        sandbox.run("true")


CHILD = r"""
import sys, time
from agentgym.envs.workspace.sandbox import WorkspaceSandbox
box = WorkspaceSandbox(files={"f": "x"})
box.run("echo secret > kept.txt")
print(box.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_caller_leaves_no_sandbox_and_its_cgroups_are_swept() -> None:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert child.stdout is not None
        bwrap = int(child.stdout.readline())
        pids = [bwrap, *(p.pid for p in descendants(bwrap))]
        assert len(pids) >= 2
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert gone(pids), "the sandbox outlived its killed caller"
    finally:
        child.kill()
        child.wait()

    # what is left on the host: the episode's cgroup directories (empty); the next process sweeps them
    def left() -> list[Path]:
        return [p for root in Path("/sys/fs/cgroup").glob("*") for p in root.rglob(f"agentgym-{child.pid}-*")]

    with WorkspaceSandbox(LIMITS) as probe:
        assert bool(left()) == ("cgroup" in probe.layers)  # no cgroups here: nothing to sweep
    sweep = "from agentgym.envs.workspace.sandbox import WorkspaceSandbox; WorkspaceSandbox().close()"
    subprocess.run([sys.executable, "-c", sweep], env=env, check=True, timeout=60)
    assert left() == []


# ---- paths and escapes ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "/tmp/x", "src/../../x", "/workspace/../root"])
def test_file_operations_stay_in_the_workspace(box: WorkspaceSandbox, path: str) -> None:
    with pytest.raises(ValueError, match="outside the workspace"):
        box.write(path, "x")
    with pytest.raises(ValueError, match="outside the workspace"):
        box.read(path)


def test_a_symlink_does_not_lead_file_operations_out(box: WorkspaceSandbox) -> None:
    box.run("ln -s /etc out && ln -s /etc/passwd pw")
    for path in ("pw", "out/passwd"):
        with pytest.raises(ValueError, match="outside the workspace"):
            box.read(path)
    with pytest.raises(ValueError, match="outside the workspace"):
        box.write("out/new", "x")


def test_the_host_is_not_there(box: WorkspaceSandbox, tmp_path: Path) -> None:
    marker = tmp_path / "host-marker"
    marker.write_text("host")
    result = box.run(
        f"ls /work /root /home /run /var {tmp_path} 2>&1; cat {marker} 2>&1; touch /usr/x /etc/x 2>&1; echo end"
    )
    assert result.output.count("No such file or directory") >= 6 and "host\n" not in result.output
    assert result.output.count("Read-only file system") == 2 or "Permission denied" in result.output


def test_no_network(box: WorkspaceSandbox) -> None:
    code = (
        "import socket\n"
        "for fam, addr in ((socket.AF_INET, ('1.1.1.1', 53)), (socket.AF_INET, ('127.0.0.1', 22))):\n"
        "    try:\n"
        "        s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(1); s.connect(addr); print('CONNECTED')\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    box.write("net.py", code)
    result = box.run("python3 net.py; cat /sys/class/net/*/address 2>&1 | head -2")
    assert "CONNECTED" not in result.output and result.output.count("refused") == 2


def test_episodes_do_not_see_each_other() -> None:
    with WorkspaceSandbox(LIMITS) as first, WorkspaceSandbox(LIMITS) as second:
        first.run("echo other-episode-secret > secret.txt; sleep 0.1")
        result = second.run("grep -rl other-episode-secret / 2>/dev/null; ls /workspace; ls /proc | grep -c '^[0-9]'")
        assert "secret" not in result.output.replace("other-episode-secret", "")
        assert second.read("secret.txt").exists is False


def test_the_server_cannot_be_read_by_the_agent(box: WorkspaceSandbox) -> None:
    result = box.run("ls -l /proc/$PPID/fd 2>&1 | head -3; head -c 20 /proc/$PPID/environ 2>&1; echo")
    assert "Permission denied" in result.output and "socket" not in result.output


def test_the_agent_cannot_signal_the_server(box: WorkspaceSandbox) -> None:
    # the server is the namespace's init: the kernel drops signals from inside that it has no handler for
    result = box.run("echo $PPID; for s in KILL STOP PIPE INT TERM; do kill -$s $PPID; done; sleep 0.2; echo alive")
    assert result.output.startswith("1\n") and result.output.endswith("alive\n"), result.output
    assert box.run("echo next").output == "next\n"


def test_a_killed_server_ends_the_episode_with_an_error(box: WorkspaceSandbox) -> None:
    assert box.pid is not None
    (server,) = [p for p in descendants(box.pid) if p.name() == "python3"]
    server.kill()
    with pytest.raises(sandbox_module.WorkspaceError):
        box.run("true")
    assert not box.alive


def test_without_bubblewrap_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "_problem", ["bubblewrap (`bwrap`) is not installed"])
    with pytest.raises(SandboxUnavailable, match="bwrap.*not installed.*apt-get install -y bubblewrap"):
        WorkspaceSandbox()


def test_concurrent_episodes_complete_without_a_failure() -> None:
    from concurrent.futures import ThreadPoolExecutor

    def episode(i: int) -> bool:
        with WorkspaceSandbox(LIMITS, {"n.txt": str(i)}) as box:
            return all(box.run("cat n.txt").output == str(i) for _ in range(5)) and box.read("n.txt").data == b"%d" % i

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(episode, range(8))) == [True] * 8


def test_a_sandbox_outlives_the_thread_that_made_it() -> None:
    """The parent-death signal follows the forking *thread*: sandboxes are forked by one long-lived
    thread, so an episode reset on a pool thread that is later retired keeps its sandbox."""
    import threading

    made: list[WorkspaceSandbox] = []
    worker = threading.Thread(target=lambda: made.append(WorkspaceSandbox(LIMITS, {"x": "still here"})))
    worker.start()
    worker.join()
    time.sleep(0.3)
    try:
        assert made[0].alive and made[0].run("cat x").output == "still here"
    finally:
        made[0].close()


def test_without_a_system_python_the_server_runs_on_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "SERVER_PYTHON", "/nonexistent/python3")
    python, roots = sandbox_module.server_python()
    assert python == os.path.realpath(sys.executable) and roots  # the base interpreter, not a venv's link
    with WorkspaceSandbox(LIMITS, {"a": "b"}) as box:
        assert box.run("cat a").output == "b"
