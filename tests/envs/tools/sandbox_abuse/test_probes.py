"""Each test is one way out of the Python tool's sandbox; each asserts, from the host side, that
the way is shut. The first 13 are the escapes a security review found in the old in-process
guard-rail (issue 16); the rest are further abuse a sandbox must contain.

Measured as root on the project's 2-core VM: against the old guard-rail (main at 9a0b932, the
code now kept as the weak mode) 24 of these 26 probes escaped, all 13 of the review's among
them; under the strong mode all 26 are contained. The two the old code already contained: the
infinite loop (its timeout) and TCP to the host's loopback (its network namespace).
"""

from __future__ import annotations

import os
import platform
import resource
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.envs.tools.sandbox_abuse.conftest import (
    PROBE_MEMORY_MB,
    PROBE_TIMEOUT_S,
    PROJECT_DIR,
    probe,
    processes_with,
    run_in_throwaway_parent,
)

Run = Callable[[str], object]
DISK_CAP_MB = 64  # the tool's default max_disk_mb: /tmp and /dev/shm each


# ---- the review's 13 -----------------------------------------------------------------------------
def test_dir_fd_write_outside_scratch(run_code: Run, tmp_path: Path) -> None:
    run_code(
        probe(
            """
        import os
        fd = os.open({target}, os.O_RDONLY | os.O_DIRECTORY)
        out = os.open("escaped.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"escaped")
    """,
            target=str(tmp_path),
        )
    )
    assert not (tmp_path / "escaped.txt").exists()


def test_dir_fd_delete_outside_scratch(run_code: Run, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    run_code(
        probe(
            """
        import os
        fd = os.open({target}, os.O_RDONLY | os.O_DIRECTORY)
        os.unlink("victim.txt", dir_fd=fd)
    """,
            target=str(tmp_path),
        )
    )
    assert victim.exists() and victim.read_text() == "keep me"


def test_sqlite3_writes_outside_scratch(run_code: Run, tmp_path: Path) -> None:
    target = tmp_path / "escaped.db"
    run_code(
        probe(
            """
        import sqlite3
        db = sqlite3.connect({target})
        db.execute("create table t (x)")
        db.commit()
    """,
            target=str(target),
        )
    )
    assert not target.exists()


def test_dev_shm_file_does_not_survive(run_code: Run) -> None:
    name = f"/agentgym-probe-{secrets.token_hex(6)}"
    try:
        result = run_code(
            probe(
                """
            import os, _posixshmem
            fd = _posixshmem.shm_open({name}, os.O_CREAT | os.O_RDWR, 0o600)
            os.write(fd, b"still here")
            print("created", os.path.exists("/dev/shm" + {name}))
        """,
                name=name,
            )
        )
        assert "created True" in result.stdout, result.stderr  # the code may use /dev/shm...
        assert not Path("/dev/shm" + name).exists()  # ...but only its own, gone after the call
    finally:
        Path("/dev/shm" + name).unlink(missing_ok=True)


def test_ctypes_memory_access_cannot_reach_outside(run_code: Run, tmp_path: Path) -> None:
    """ctypes.string_at finds the guard's state in memory and ctypes.memmove rewrites it (the
    scratch path becomes "", so every path is "inside"); then write outside."""
    target = tmp_path / "escaped.txt"
    result = run_code(
        probe(
            """
        import ctypes, os, sys
        needle = os.path.realpath(os.getcwd()).encode()
        header = sys.getsizeof("") - 1  # bytes before a compact ASCII str's characters
        patched = 0
        for line in open("/proc/self/maps").read().splitlines():
            span, perms = line.split()[:2]
            if not perms.startswith("rw") or line.endswith("]") and "[heap]" not in line:
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            blob = ctypes.string_at(lo, hi - lo)
            at = blob.find(needle)
            while at >= 0:
                obj = at - header
                if (obj >= 0 and at + len(needle) < len(blob) and blob[at + len(needle)] == 0
                        and int.from_bytes(blob[obj + 8:obj + 16], "little") == id(str)
                        and int.from_bytes(blob[obj + 16:obj + 24], "little") == len(needle)):
                    ctypes.memmove(lo + obj + 16, bytes(8), 8)  # length := 0
                    patched += 1
                at = blob.find(needle, at + 1)
        print("patched", patched, flush=True)
        with open({target}, "w") as f:
            f.write("escaped")
    """,
            target=str(target),
        )
    )
    assert not target.exists(), result.stdout


def test_gc_cannot_remove_the_guard(run_code: Run, tmp_path: Path) -> None:
    """gc finds the audit hook (the interpreter's list of hooks is out of reach, the function is
    not) and empties the rules in its closure; then write outside."""
    target = tmp_path / "escaped.txt"
    result = run_code(
        probe(
            """
        import gc
        for obj in gc.get_objects():
            if type(obj).__name__ == "function" and obj.__name__ == "hook":
                for cell in obj.__closure__:
                    rules = cell.cell_contents
                    if isinstance(rules, (dict, set)):
                        rules.clear()  # refused events, path events, ok devices
                    elif isinstance(rules, int):
                        cell.cell_contents = 0  # the write flags the open check looks for
                print("emptied the hook", flush=True)
        with open({target}, "w") as f:
            f.write("escaped")
    """,
            target=str(target),
        )
    )
    assert not target.exists(), result.stdout + result.stderr


def test_fork_exec_shell_is_not_root_and_stays_inside(run_code: Run, tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    result = run_code(
        probe(
            """
        pid = spawn(["/bin/sh", "-c", "echo uid=$(id -u); echo escaped > " + {target}])
        os.waitpid(pid, 0)
    """,
            spawn=True,
            target=str(target),
        )
    )
    assert "uid=" in result.stdout, result.stderr  # the shell ran...
    assert "uid=0" not in result.stdout and not target.exists()  # ...unprivileged, and wrote nothing here


def test_pidfd_send_signal_cannot_kill_the_parent(strong: None) -> None:
    done = run_in_throwaway_parent(
        probe("""
        import os, signal
        for pid in {{os.getppid(), PARENT_PID}}:
            try:
                signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)
                print("sent SIGKILL to", pid)
            except OSError as exc:
                print("refused", pid, exc)
    """)
    )
    assert done.returncode == 0 and "parent survived" in done.stdout, (done.returncode, done.stdout, done.stderr)


def test_daemonized_child_does_not_outlive_the_call(run_code: Run) -> None:
    """A double-forked, setsid'd child that also moves itself to the root cgroups."""
    mark = f"{30 + secrets.randbelow(10**6) / 10**6:.6f}"  # a sleep length nothing else uses
    try:
        result = run_code(
            probe(
                """
            import time
            script = ("for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do "
                      "echo $$ > $f 2>/dev/null; done; exec sleep " + {mark})
            pid = spawn(["/bin/sh", "-c", "/bin/sh -c '" + script + "' &"], setsid=True)
            os.waitpid(pid, 0)
            time.sleep(0.5)  # time to get away
            print("daemon started")
        """,
                spawn=True,
                mark=mark,
            )
        )
        assert "daemon started" in result.stdout, result.stderr
        survivors = processes_with(f"sleep {mark}")
        assert not survivors, survivors
    finally:
        for proc in processes_with(f"sleep {mark}", wait_s=0):
            proc.kill()


def test_disk_use_is_capped(run_code: Run) -> None:
    result = run_code(
        probe("""
        chunk = bytes(1 << 20)
        written = 0
        for folder in ("./", "/dev/shm/"):
            try:
                for i in range(32):
                    with open(folder + "fill" + str(i), "wb") as f:
                        for _ in range(8):  # 8 MB files: below the per-file limit
                            f.write(chunk)
                            written += 1
            except OSError as exc:
                print("stopped in", folder, type(exc).__name__)
        print("MB", written)
    """)
    )
    written = int(result.stdout.split("MB")[-1])
    assert 0 < written <= 2 * DISK_CAP_MB + 1, result.stdout


def test_root_only_files_are_unreadable(run_code: Run) -> None:
    result = run_code(
        probe("""
        for path in ("/etc/shadow", "/root/.bash_history", "/proc/1/environ"):
            try:
                print(path, open(path, errors="replace").read()[:200])
            except OSError as exc:
                print(path, "refused", type(exc).__name__)
    """)
    )
    assert "root:" not in result.stdout and "refused" in result.stdout, result.stdout


def test_project_files_are_unreadable(run_code: Run) -> None:
    token = secrets.token_hex(16)
    secret_file = PROJECT_DIR / f".probe-secret-{token[:8]}"
    secret_file.write_text(token)
    secret_file.chmod(0o644)  # readable by anyone who can see it: only the mount view hides it
    try:
        result = run_code(
            probe(
                """
            for path in ({secret}, {pyproject}):
                try:
                    print(open(path).read()[:100])
                except OSError as exc:
                    print(path, "refused", type(exc).__name__)
        """,
                secret=str(secret_file),
                pyproject=str(PROJECT_DIR / "pyproject.toml"),
            )
        )
        assert token not in result.stdout and "[project]" not in result.stdout, result.stdout
    finally:
        secret_file.unlink()


def test_parent_environment_is_unreadable(strong: None) -> None:
    token = secrets.token_hex(16)
    done = run_in_throwaway_parent(
        probe("""
        import os
        found = []
        for pid in ["PARENT_PID", str(os.getppid())] + os.listdir("/proc"):
            try:
                with open("/proc/" + pid + "/environ", "rb") as f:
                    found.append(f.read().decode(errors="replace"))
            except OSError:
                pass
        print("\\n".join(found))
    """),
        env_secret=token,
    )
    assert "parent survived" in done.stdout, done.stderr
    assert token not in done.stdout


# ---- more abuse -----------------------------------------------------------------------------------
def test_parent_memory_is_unreadable(strong: None) -> None:
    token = secrets.token_hex(16)
    done = run_in_throwaway_parent(
        probe(
            """
        import os
        for pid in ("PARENT_PID", str(os.getppid())):
            try:
                with open("/proc/" + pid + "/maps") as maps, open("/proc/" + pid + "/mem", "rb") as mem:
                    for line in maps:
                        span, perms = line.split()[:2]
                        if perms.startswith("rw"):
                            lo, hi = (int(x, 16) for x in span.split("-"))
                            try:
                                mem.seek(lo)
                                blob = mem.read(hi - lo)
                            except OSError:
                                continue
                            at = blob.find({prefix})
                            if at >= 0:
                                print("found", blob[at:at + 32].decode(errors="replace"))
            except OSError as exc:
                print(pid, "refused", type(exc).__name__)
    """,
            prefix=token[:8].encode(),
        ),
        secret=token,
    )
    assert "parent survived" in done.stdout, done.stderr
    assert token not in done.stdout


def test_fork_bomb_is_capped(run_code: Run) -> None:
    """300 processes, after first moving itself to the root cgroups (out of any per-run cap)."""
    mark = f"{3 + secrets.randbelow(10**6) / 10**6:.6f}"
    result = run_code(
        probe(
            """
        mover = spawn(["/bin/sh", "-c", "for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do "
                                        "echo " + str(os.getpid()) + " > $f 2>/dev/null; done"])
        os.waitpid(mover, 0)
        started = 0
        try:
            for _ in range(300):
                spawn(["/bin/sleep", {mark}])
                started += 1
        except OSError as exc:
            print("refused", exc)
        print("started", started)
    """,
            spawn=True,
            mark=mark,
        )
    )
    started = int(result.stdout.split("started")[-1])
    assert started < 16, result.stdout  # max_processes
    assert not processes_with(f"/bin/sleep {mark}", wait_s=0.5)


def test_memory_is_capped_across_processes(run_code: Run) -> None:
    """Each process is below the per-process limit, but together they are far above it. A hog
    that prints "held" has held its 300 MB for 1.5 s; they all start together."""
    result = run_code(
        probe(
            """
        import time
        hog = "import time; b = b'x' * (300 << 20); time.sleep(1.5); print('held', flush=True)"
        pids = [spawn([sys.executable, "-c", hog]) for _ in range(4)]
        for pid in pids:
            os.waitpid(pid, 0)
    """,
            spawn=True,
        )
    )
    held = result.stdout.count("held")
    assert held * 300 <= PROBE_MEMORY_MB + 2 * DISK_CAP_MB, result.stdout


def test_infinite_loop_is_stopped(run_code: Run) -> None:
    start = time.monotonic()
    result = run_code("while True:\n    pass")
    assert result.timed_out and time.monotonic() - start < PROBE_TIMEOUT_S + 2


def test_no_tcp_to_the_host_loopback(run_code: Run) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        code = (
            f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), 2); print('connected')"
        )
        result = run_code(
            probe(
                """
            pid = spawn([sys.executable, "-c", {code}])
            os.waitpid(pid, 0)
        """,
                spawn=True,
                code=code,
            )
        )
        with pytest.raises(socket.timeout):
            server.accept()
    assert "connected" not in result.stdout


def test_no_connection_to_host_unix_sockets(run_code: Run, tmp_path: Path) -> None:
    """A socket file on the host (think docker.sock): a network namespace does not hide it."""
    path = str(tmp_path / "host.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        server.settimeout(0.5)
        code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r}); print('connected')"
        result = run_code(
            probe(
                """
            pid = spawn([sys.executable, "-c", {code}])
            os.waitpid(pid, 0)
        """,
                spawn=True,
                code=code,
            )
        )
        with pytest.raises(socket.timeout):
            server.accept()
    assert "connected" not in result.stdout


def test_project_directory_is_not_writable(run_code: Run) -> None:
    target = PROJECT_DIR / f".probe-escaped-{secrets.token_hex(4)}"
    try:
        run_code(
            probe(
                """
            pid = spawn(["/bin/sh", "-c", "echo escaped > " + {target}])
            os.waitpid(pid, 0)
        """,
                spawn=True,
                target=str(target),
            )
        )
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_host_processes_cannot_be_signalled(run_code: Run) -> None:
    victim = subprocess.Popen(["sleep", "30"])
    try:
        run_code(
            probe(
                """
            pid = spawn(["/bin/sh", "-c", "kill -9 " + str({victim})])
            os.waitpid(pid, 0)
            os.kill({victim}, 9)
        """,
                spawn=True,
                victim=victim.pid,
            )
        )
        time.sleep(0.1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_sysv_shared_memory_does_not_survive(run_code: Run) -> None:
    key = 0x5A000000 + secrets.randbelow(1 << 20)
    code = (
        f"import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        f"print('shmid', libc.shmget({key}, 4096, 0o1666), ctypes.get_errno())"
    )
    try:
        result = run_code(
            probe(
                """
            pid = spawn([sys.executable, "-c", {code}])
            os.waitpid(pid, 0)
        """,
                spawn=True,
                code=code,
            )
        )
        assert "shmid" in result.stdout, result.stderr
        assert not _sysv_segment(key), result.stdout
    finally:
        shmid = _sysv_segment(key)
        if shmid is not None:
            subprocess.run(["ipcrm", "-m", str(shmid)], check=False)


def _sysv_segment(key: int) -> int | None:
    """The shmid of the host's System V shared memory segment with ``key``, if there is one."""
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[0]) == key or int(fields[0]) == key - (1 << 32):
            return int(fields[1])
    return None


def test_only_private_directories_are_writable(run_code: Run) -> None:
    result = run_code(
        probe("""
        import os
        writable = []
        for top in sorted(os.listdir("/")):
            for path in ["/" + top] + [os.path.join("/" + top, d) for d in
                                       (os.listdir("/" + top) if os.path.isdir("/" + top) else [])][:200]:
                if path.startswith(("/proc", "/sys")) or not os.path.isdir(path) or os.path.islink(path):
                    continue
                if os.access(path, os.W_OK):
                    writable.append(path)
        print("writable", " ".join(writable))
    """)
    )
    writable = set(result.stdout.split("writable")[-1].split())
    assert writable and writable <= {"/tmp", "/dev/shm"} | {p for p in writable if p.startswith("/tmp/")}, writable


def test_no_capabilities_through_a_user_namespace(run_code: Run) -> None:
    if not Path("/usr/bin/unshare").exists():
        pytest.skip("no /usr/bin/unshare to try with")
    result = run_code(
        probe(
            """
        pid = spawn(["/usr/bin/unshare", "--user", "--map-root-user", "/bin/sh", "-c", "echo uid-in-ns=$(id -u)"])
        os.waitpid(pid, 0)
    """,
            spawn=True,
        )
    )
    assert "uid-in-ns=0" not in result.stdout, result.stdout


def test_signals_to_the_parent_by_pid_are_refused(strong: None) -> None:
    done = run_in_throwaway_parent(
        probe(
            """
        import os
        pid = spawn(["/bin/sh", "-c", "kill -9 PARENT_PID " + str(os.getppid())])
        os.waitpid(pid, 0)
    """,
            spawn=True,
        )
    )
    assert done.returncode == 0 and "parent survived" in done.stdout, (done.returncode, done.stderr)


def test_kernel_attack_surface_is_narrowed(run_code: Run) -> None:
    """io_uring and userfaultfd (x86_64 numbers), two interfaces behind many kernel exploits."""
    if platform.machine() != "x86_64":
        pytest.skip("the system call numbers here are x86_64's")
    code = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        "print('io_uring_setup', libc.syscall(425, 1, ctypes.create_string_buffer(120)), ctypes.get_errno()); "
        "print('userfaultfd', libc.syscall(323, 0), ctypes.get_errno())"
    )
    result = run_code(
        probe(
            """
        pid = spawn([sys.executable, "-c", {code}])
        os.waitpid(pid, 0)
    """,
            spawn=True,
            code=code,
        )
    )
    assert "io_uring_setup -1 1\n" in result.stdout and "userfaultfd -1 1\n" in result.stdout, result.stdout  # EPERM


# ---- issue 24: what a second review found ------------------------------------------------------
def test_only_unix_sockets_can_be_made(run_code: Run) -> None:
    """AF_VSOCK talks to the hypervisor host, and no network namespace covers it: the seccomp filter
    refuses it, and every socket family but AF_UNIX (which asyncio, multiprocessing and
    socketpair use)."""
    if platform.machine() != "x86_64":
        pytest.skip("the seccomp filter has a table for x86_64 only")
    result = run_code(
        probe("""
        import ctypes, socket
        libc = ctypes.CDLL(None, use_errno=True)
        for name, family, kind in [("vsock", 40, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM),
                                   ("inet6", socket.AF_INET6, socket.SOCK_DGRAM), ("netlink", 16, socket.SOCK_RAW)]:
            fd = libc.syscall(41, family, kind, 0)  # socket(2) itself, as any library would call it
            print(name, "made" if fd >= 0 else f"refused errno={{ctypes.get_errno()}}")
        a, b = socket.socketpair()
        a.sendall(b"ping")
        print("unix", b.recv(4).decode(), socket.socket(socket.AF_UNIX).family.name)
    """)
    )
    lines = result.stdout.splitlines()  # type: ignore[attr-defined]
    assert lines == [
        "vsock refused errno=1",
        "inet refused errno=1",
        "inet6 refused errno=1",
        "netlink refused errno=1",
        "unix ping AF_UNIX",
    ], (result.stdout, result.stderr)  # type: ignore[attr-defined]


def test_real_time_and_nice_limits_are_not_inherited(run_code: Run) -> None:
    """A caller allowed real-time scheduling (``RLIMIT_RTPRIO``) or a raised nice ceiling does not pass
    them on: the code could starve the host's CPUs with a SCHED_FIFO busy loop."""
    saved = {which: resource.getrlimit(which) for which in (resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE)}
    try:
        for which, (_, hard) in saved.items():
            resource.setrlimit(which, (10, hard if hard == resource.RLIM_INFINITY else max(10, hard)))
    except (ValueError, OSError):
        pytest.skip("this user cannot raise RLIMIT_RTPRIO/RLIMIT_NICE to show they are not inherited")
    try:
        result = run_code(
            "import resource\n"
            "print(resource.getrlimit(resource.RLIMIT_RTPRIO), resource.getrlimit(resource.RLIMIT_NICE))"
        )
    finally:
        for which, limits in saved.items():
            resource.setrlimit(which, limits)
    assert result.stdout.strip() == "(0, 0) (0, 0)", (result.stdout, result.stderr)  # type: ignore[attr-defined]


def test_a_caller_killed_mid_call_leaves_no_files(strong: None, tmp_path: Path) -> None:
    """The caller (a rollout worker) is SIGKILLed while its code runs: its output files (up to
    ``max_file_mb`` each) must not stay behind in the temp directory until some later process
    happens to clean up."""
    caller = (
        "from agentgym.envs.tools.python import PythonTool\n"
        "PythonTool(timeout_s=60).run('import time\\nprint(1, flush=True)\\ntime.sleep(60)')\n"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_DIR),
        "AGENTGYM_SANDBOX": "strong",
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.Popen([sys.executable, "-c", caller], env=env, cwd=PROJECT_DIR)
    try:
        deadline = time.monotonic() + 30
        while not any(p.name() == "bwrap" for p in _descendants(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "the sandboxed call never started"
            time.sleep(0.05)
        time.sleep(0.5)  # well into the call
        sandbox = _descendants(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs(sandbox, timeout=5)
    assert not alive, alive
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
