"""The program that runs INSIDE a workspace sandbox: it executes the host's requests, one at a time.

This file is never imported by agentgym: ``sandbox.py`` reads its text and runs it with the system
Python (``python3 -I -S -c <this file>``) as the sandbox's only long-lived process, as the unprivileged
sandbox user, in the sandbox's namespaces. It uses the standard library only.

Protocol (stdin: requests, stdout: replies; nothing else writes to either). A request is a line
holding a byte count N, then N bytes of ``marshal`` data: ``(header dict, payload bytes)`` (the host
writes it; marshal is built in, so the server imports no json, which is most of a start-up). A reply
is one line of ``key=value`` fields - ``~`` None, ``?0``/``?1`` a bool, ``@N`` a string of N UTF-8
bytes that follows the line (in field order), else an int or a float - whose last field is
``size=N``, then the strings, then N bytes of payload. Nothing in a reply is evaluated on the host.
The server says ``ready=?1`` once, then answers each request with one reply (``error=`` on failure).

* ``run``: ``cmd``, ``timeout``, ``max_output``, optional ``cwd`` -> ``exit_code`` (None on timeout, -N for signal N),
  ``timed_out``, ``output`` (stdout and stderr merged, the first ``max_output`` bytes), ``truncated``,
  ``cwd``. The command runs as ``bash -c`` in the working directory the previous command left
  (``cd`` persists), with stdin at /dev/null, in its own session, under per-call limits; when it
  exits or times out, EVERY other process in the sandbox is killed (daemons, ``setsid`` escapes),
  so nothing the command started outlives the call.
* ``write``: ``path``, ``force`` + payload -> ``path``. Workspace paths only (after resolving
  symlinks). ``force`` (the verifier's files) replaces whatever is on the way (a symlinked or
  non-directory parent, a directory in the file's place) instead of following it.
* ``read``: ``path``, ``max_bytes`` -> ``exists``, ``size`` + payload (at most ``max_bytes``).
* ``archive`` -> payload: the workspace as an uncompressed tar (symlinks stored as links).
* ``extract`` + payload (a tar from ``archive``): unpacked into the workspace (tar's ``data`` filter).

The process makes itself non-dumpable first: code the agent runs as the same user then cannot read
its memory or file descriptors through /proc (``ptrace`` is refused by the seccomp filter anyway).
"""

import _signal  # the C module: the signal package imports enum, which costs start-up time
import ctypes
import marshal
import os
import resource
import select
import sys
import time

# (tarfile, io and shutil are imported where they are used: start-up time is the episode's reset time)

WORKSPACE = "/workspace"
SIGINT, SIGKILL, SIGPIPE, SIGCHLD = 2, 9, 13, 17
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    # /workspace is a tmpfs that (as root) bwrap made root's while commands run as nobody: without this,
    # git refuses the repository ("dubious ownership"). Everything in the sandbox is one user, so the
    # check protects nothing here. (Environment config counts as command-line config, which git honours.)
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}
# $1: the working directory to start in, $2: the command. The EXIT trap reports where it ended on fd {fd}.
SCRIPT = 'cd -- "$1" 2>/dev/null || cd /workspace; trap \'pwd -P >&{fd} 2>/dev/null\' EXIT; eval "$2"'


def spawn(argv, cwd, out_fd, keep_fd, timeout, memory_mb, max_file_mb):
    """Fork and exec ``argv`` in its own session: stdin /dev/null, stdout and stderr ``out_fd``,
    ``keep_fd`` inherited, every other descriptor closed, the per-call limits set. (The server has one
    thread, so a bare fork is safe; it is cheaper than importing subprocess at every start-up.)"""
    null = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return
        try:
            os.setsid()
            os.dup2(null, 0)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            os.closerange(3, keep_fd)
            os.closerange(keep_fd + 1, 1 << 16)
            os.set_inheritable(keep_fd, True)
            cpu = int(timeout) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            if memory_mb:
                resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
            if max_file_mb:
                resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_mb << 20, max_file_mb << 20))
            try:
                os.chdir(cwd)
            except OSError:
                os.chdir(WORKSPACE)
            os.execve(argv[0], argv, ENV)
        finally:
            os._exit(127)
    os.close(null)
    return pid


def wait_exit(pid):
    """The child's exit status if it has exited, else None. Every other exited child is reaped on the
    way: the server is the namespace's init, so orphans of the command's processes are its children."""
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if done == 0:
            return None
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def others():
    """Pids of every live process in this sandbox but this one (the namespace's init, pid 1)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X") or live_threads(name):
            found.append(int(name))
    return found


def live_threads(pid):
    """Whether a process whose leader is dead still runs threads: a main thread that ended with
    ``SYS_exit`` (not ``exit_group``) shows as a zombie while the others go on. SIGKILL to the pid
    takes the whole thread group."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def kill_others(deadline_s=2.0):
    """SIGKILL every other process until none is left (a fork loop is capped by the pids cgroup)."""
    end = time.monotonic() + deadline_s
    while True:
        # every process of the namespace but pid 1 and this one, in one step a fork chain cannot outrun
        try:  # noqa: SIM105 - no contextlib: every import is start-up time
            os.kill(-1, SIGKILL)
        except OSError:
            pass
        pids = others()
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, SIGKILL)
            except OSError:
                continue
        reap()
        if time.monotonic() > end:
            return False
        time.sleep(0.001)


def drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _on_child(_signum, _frame):
    """Nothing to do here: the signal's wakeup byte is what wakes the server."""


class Server:
    def __init__(self, memory_mb, max_file_mb):
        # SIGCHLD wakes the wait in op_run (a byte on this pipe), so that exited orphans are reaped at once
        self.wake, wake_w = os.pipe()
        os.set_blocking(self.wake, False)
        os.set_blocking(wake_w, False)
        _signal.signal(SIGCHLD, _on_child)
        _signal.set_wakeup_fd(wake_w)
        self.memory_mb = memory_mb
        self.max_file_mb = max_file_mb
        self.cwd = WORKSPACE
        self.inp = sys.stdin.buffer
        self.out = sys.stdout.buffer

    # ---- framing
    def receive(self):
        line = self.inp.readline(64)
        if not line:
            return None, b""
        size = int(line)
        data = self.inp.read(size)
        if len(data) != size:
            return None, b""
        header, payload = marshal.loads(data)
        return header, payload

    def send(self, fields, payload=b""):
        parts, blobs = [], []
        for key, value in fields.items():
            if value is None:
                parts.append(key + "=~")
            elif value is True or value is False:
                parts.append(f"{key}=?{int(value)}")
            elif isinstance(value, (int, float)):
                parts.append(f"{key}={value!r}")
            else:
                blob = str(value).encode("utf-8", "replace")
                parts.append(f"{key}=@{len(blob)}")
                blobs.append(blob)
        parts.append(f"size={len(payload)}")
        self.out.write(" ".join(parts).encode() + b"\n" + b"".join(blobs) + payload)
        self.out.flush()

    # ---- paths
    def resolve(self, path):
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError("path must be a non-empty string")
        full = os.path.realpath(os.path.join(WORKSPACE, path))
        if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
            raise ValueError(f"{path!r} is outside the workspace ({WORKSPACE})")
        return full

    # ---- operations
    def op_run(self, req, _payload):
        timeout = float(req["timeout"])
        cap = int(req["max_output"])
        out_r, out_w = os.pipe()
        cwd_r, cwd_w = os.pipe()
        start = time.monotonic()
        argv = ["/bin/bash", "-c", SCRIPT.format(fd=cwd_w), "bash", req.get("cwd") or self.cwd, req["cmd"]]
        try:
            pid = spawn(argv, WORKSPACE, out_w, cwd_w, timeout, self.memory_mb, self.max_file_mb)
        finally:
            os.close(out_w)
            os.close(cwd_w)
        kept = bytearray()
        total = 0
        timed_out = False
        deadline = start + timeout
        open_ = True
        code = None
        try:  # the child's exit wakes the wait below, even while a background process holds the pipe
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        while True:
            code = wait_exit(pid)
            if code is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            watched = ([out_r] if open_ else []) + ([pidfd] if pidfd is not None else []) + [self.wake]
            ready = select.select(watched, [], [], left if pidfd is not None else min(left, 0.005))[0]
            if self.wake in ready:  # a child exited (SIGCHLD): reap it above
                drain(self.wake)
            if out_r in ready:
                chunk = os.read(out_r, 65536)
                if not chunk:
                    open_ = False
                else:
                    total += len(chunk)
                    if len(kept) < cap:
                        kept += chunk[: cap - len(kept)]
        if pidfd is not None:
            os.close(pidfd)
        # what is already in the pipe (a background process may hold it open: don't wait for EOF)
        os.set_blocking(out_r, False)
        try:
            while open_:
                chunk = os.read(out_r, 65536)
                if not chunk:
                    break
                total += len(chunk)
                if len(kept) < cap:
                    kept += chunk[: cap - len(kept)]
        except BlockingIOError:
            pass
        if timed_out:
            try:  # noqa: SIM105 - no contextlib: every import is start-up time
                os.killpg(pid, SIGKILL)
            except OSError:
                pass
        kill_others()
        if code is None:
            try:  # noqa: SIM105 - no contextlib: every import is start-up time
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            except ChildProcessError:
                pass
        reap()
        os.close(out_r)
        os.set_blocking(cwd_r, False)
        try:
            reported = os.read(cwd_r, 4096).decode("utf-8", "replace").strip().splitlines()
        except BlockingIOError:
            reported = []
        os.close(cwd_r)
        if reported and reported[-1].startswith("/") and os.path.isdir(reported[-1]):
            self.cwd = reported[-1]
        if timed_out:
            code = None
        return {
            "exit_code": code,
            "timed_out": timed_out,
            "output": kept.decode("utf-8", "replace"),
            "truncated": total > cap,
            "cwd": self.cwd,
            "seconds": time.monotonic() - start,
        }, b""

    def op_write(self, req, payload):
        path = req["path"]
        if req.get("force"):
            full = self.force_path(path)
        else:
            full = self.resolve(path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if os.path.isdir(full):
                raise ValueError(f"{path!r} is a directory")
            if os.path.exists(full) and not os.path.isfile(full):
                raise ValueError(f"{path!r} is not a regular file")
        # O_NONBLOCK: opening a FIFO for writing would wait for a reader, hanging the server (ENXIO instead)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        with open(fd, "wb") as f:
            if (os.fstat(fd).st_mode & 0o170000) != 0o100000:  # S_ISREG, without importing stat
                raise ValueError(f"{path!r} is not a regular file")
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            f.write(payload)
        return {"path": os.path.relpath(full, WORKSPACE)}, b""

    def force_path(self, path):
        """The verifier's way: every component below the workspace made a real directory (what is in
        the way removed, symlinks not followed), the file's own place emptied."""
        parts = [p for p in os.path.normpath(path).split("/") if p and p != "."]
        if not parts or ".." in parts or path.startswith("/"):
            raise ValueError(f"{path!r} must be a relative path inside the workspace")
        here = WORKSPACE
        for part in parts[:-1]:
            here = os.path.join(here, part)
            if os.path.islink(here) or (os.path.exists(here) and not os.path.isdir(here)):
                os.unlink(here)
            if not os.path.isdir(here):
                os.mkdir(here)
        full = os.path.join(here, parts[-1])
        if os.path.islink(full) or (os.path.exists(full) and not os.path.isdir(full)):
            os.unlink(full)
        elif os.path.isdir(full):
            import shutil

            shutil.rmtree(full)
        return full

    def op_files(self, _req, payload):
        """Many files at once (the task's, at reset): the payload is ``marshal`` data ``{path: bytes}``."""
        count = 0
        for path, data in marshal.loads(payload).items():
            self.op_write({"path": path}, data)
            count += 1
        return {"count": count}, b""

    def op_read(self, req, _payload):
        full = self.resolve(req["path"])
        if not os.path.exists(full):
            return {"exists": False, "file_size": 0}, b""
        if os.path.isdir(full):
            raise ValueError(f"{req['path']!r} is a directory")
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the server
        with open(fd, "rb") as f:
            import stat

            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{req['path']!r} is not a regular file")
            data = f.read(int(req["max_bytes"]))
            return {"exists": True, "file_size": os.fstat(fd).st_size}, data

    def op_archive(self, _req, _payload):
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(os.listdir(WORKSPACE)):
                tar.add(os.path.join(WORKSPACE, name), arcname=name, recursive=True)
        return {}, buf.getvalue()

    def op_extract(self, _req, payload):
        import io
        import tarfile

        with tarfile.open(fileobj=io.BytesIO(payload), mode="r") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(WORKSPACE, filter="data")
                return {}, b""
            for member in tar.getmembers():  # Python < 3.11.4: the data filter's main refusals by hand
                parts = member.name.split("/")
                if member.name.startswith("/") or ".." in parts:
                    raise ValueError(f"archive member {member.name!r} is outside the workspace")
                if not (member.isfile() or member.isdir() or member.issym()):
                    continue
                if member.issym() and (member.linkname.startswith("/") or ".." in member.linkname.split("/")):
                    continue
                member.mode = (member.mode | 0o600) & 0o755
                tar.extract(member, WORKSPACE, set_attrs=not member.issym())
        return {}, b""

    def serve(self):
        self.send({"ready": True})
        while True:
            try:
                req, payload = self.receive()
            except (ValueError, EOFError, TypeError):
                self.send({"error": "malformed request"})
                continue
            if req is None:
                return
            op = getattr(self, "op_" + str(req.get("op")), None)
            if op is None:
                self.send({"error": f"unknown operation {req.get('op')!r}"})
                continue
            try:
                header, data = op(req, payload)
            except Exception as exc:  # the host gets the reason; the server goes on
                kill_others()
                self.send({"error": f"{type(exc).__name__}: {exc}"})
                continue
            self.send(header, data)


def main():
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    _signal.signal(SIGPIPE, _signal.SIG_DFL)  # and commands inherit the default (Python ignores it)
    # no handler for SIGINT either: the kernel then drops it (like every signal) from inside, as the
    # server is the namespace's init; Python's handler would end the server with KeyboardInterrupt
    _signal.signal(SIGINT, _signal.SIG_DFL)
    os.chdir(WORKSPACE)
    os.umask(0o022)
    Server(int(sys.argv[1]), int(sys.argv[2])).serve()


if __name__ == "__main__":
    main()
