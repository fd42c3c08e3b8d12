"""The strong mode: the snippet runs in fresh namespaces built by bubblewrap, as an unprivileged user.

``bwrap`` (Debian/Ubuntu package ``bubblewrap``) builds the boundary; this module chooses its
arguments, probes once per process whether it works here, and runs snippets through it. What
the child sees and may do is listed in ``agentgym.envs.tools.sandbox``'s docstring.

How it is built, and why that way:

* As root, ``bwrap`` runs as root *without* a user namespace (so it can bind the interpreter
  even from a directory like ``/root/.pyenv``, which an unprivileged ``bwrap`` cannot reach)
  and hands ``setpriv`` only CAP_SETUID/SETGID/SETPCAP; ``setpriv`` then becomes uid/gid 65534
  (``nobody``) with no groups, no capabilities (bounding set cleared) and no_new_privs before it
  executes Python. A user namespace is avoided on purpose: inside one, bubblewrap maps the
  sandbox user to the caller's uid, i.e. to root on the host. Nested user namespaces are
  refused by the seccomp filter instead.
* As any other user, ``bwrap`` makes a user namespace itself (``--unshare-user``, with
  ``--disable-userns`` so the code cannot make another); the child keeps the caller's uid.
* The snippet arrives on stdin (a memfd) and stdin is ``/dev/null`` once it is read; stdout and
  stderr are nameless files on this side (gone with the last process that holds them), capped by
  ``RLIMIT_FSIZE``.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from agentgym.envs.tools.sandbox.process import (
    SandboxResult,
    capped,
    forget_cgroups,
    make_preexec,
    make_run_cgroups,
    run_child,
    site_packages,
    snippet_limits,
    user_task_count,
)
from agentgym.envs.tools.sandbox.seccomp import filter_program

SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
PATH = "/usr/local/bin:/usr/bin:/bin"
# Read-only views of the system, besides /usr and the interpreter's own directories.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/mime.types",
)
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`) on a kernel that allows "
    "namespaces, or opt into the weaker in-process guard-rail with AGENTGYM_SANDBOX=weak "
    "(or the python tool's option sandbox=weak)"
)

# Runs as the sandbox user inside the namespaces: read the snippet from stdin, run it as __main__.
# argv: [-c, *site_packages_dirs]
BOOTSTRAP = r"""
import os, sys
sys.path.extend(sys.argv[1:])  # site-packages, added without running .pth files (python -S)
with open(0, "rb", closefd=False) as _f:
    _source = _f.read()
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.argv = ["main.py"]
del _f, _null
try:
    _code = compile(_source, "main.py", "exec")
    exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _exc:  # the traceback without this bootstrap's frames, with main.py's lines
    import linecache, traceback
    linecache.cache["main.py"] = (0, None, _source.decode("utf-8", "replace").splitlines(True), "main.py")
    _te = traceback.TracebackException(type(_exc), _exc, _exc.__traceback__.tb_next)
    _te.stack = traceback.StackSummary.from_list([f for f in _te.stack if f.filename != "<string>"])
    sys.stderr.write("".join(_te.format()))
    sys.exit(1)
"""


class SandboxUnavailable(RuntimeError):
    """The strong sandbox cannot run on this machine (and the weak mode was not chosen)."""


def _python_roots(python: str | None) -> list[str]:
    """Directories the interpreter needs, as absolute paths (its prefixes, venv, site-packages)."""
    if python is None:
        paths = {
            sys.prefix,
            sys.exec_prefix,
            sys.base_prefix,
            sys.base_exec_prefix,
            *site_packages(),
            os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
        }
    else:
        exe = os.path.abspath(python)
        venv = os.path.dirname(os.path.dirname(exe))
        paths = {os.path.dirname(os.path.dirname(os.path.realpath(exe)))}
        if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
            paths.add(venv)
    return sorted({os.path.abspath(p) for p in paths} | {os.path.realpath(p) for p in paths})


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without those inside another one of them or inside /usr (bound anyway)."""
    out: list[str] = []
    for path in sorted(paths):
        if path == "/" or any(path == root or path.startswith(root.rstrip("/") + "/") for root in [*out, "/usr"]):
            continue
        out.append(path)
    return out


TMPFS_MOUNTS = ("/tmp", "/dev/shm")


def _bind_roots(roots: list[str], made: set[str]) -> list[str]:
    """Read-only binds of ``roots``, making each missing ancestor first (adds them to ``made``)."""
    argv: list[str] = []
    for root in roots:
        for parent in reversed(Path(root).parents[:-1]):  # every ancestor below "/", top first
            if str(parent) not in made:  # world-traversable even where the real one is not (/root)
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        argv += ["--ro-bind", os.path.realpath(root), root]
    return argv


def isolation_argv(*flags: str) -> tuple[list[str], list[str]]:
    """``(argv, layers)``: what every sandbox here starts with (the python tool's and the workspace's):
    bubblewrap with its namespaces (and ``flags``), the unprivileged user, and the read-only system
    (``/usr``, the ``/bin``/``/lib*`` links, a few ``/etc`` files)."""
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid",
        *flags,
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    layers = ["namespaces"]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        layers.append("unprivileged-user")
    else:
        argv += ["--unshare-user", "--disable-userns"]
        layers.append("userns")
    argv += ["--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for path in ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    return argv, layers


def bwrap_argv(python: str | None, disk_bytes: int, seccomp_fd: int | None) -> tuple[list[str], list[str]]:
    """``(argv, layers)``: the bubblewrap command line that runs the bootstrap, and the layers it adds."""
    as_root = os.geteuid() == 0
    argv, layers = isolation_argv()
    made = {"/", "/usr", "/etc", *SYSTEM_DIRS}
    roots = _outermost(_python_roots(python))
    # an interpreter under /tmp or /dev/shm (a clone in /tmp) is bound after the private tmpfs
    # mounted there, or that tmpfs would hide it
    late = [r for r in roots if any(r.startswith(m + "/") for m in TMPFS_MOUNTS)]
    argv += _bind_roots([r for r in roots if r not in late], made)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for mount in TMPFS_MOUNTS:
        argv += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", mount]
        made.add(mount)
    argv += _bind_roots(late, made)
    argv += ["--remount-ro", "/", "--chdir", "/tmp"]
    layers += ["read-only-root", "tmpfs-quota"]
    env = {
        "PATH": PATH,
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    for name, value in env.items():
        argv += ["--setenv", name, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
        layers.append("seccomp")
    argv.append("--")
    if as_root:
        argv += [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_GID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    if python is None:
        argv += [sys.executable, "-I", "-B", "-S", "-u", "-X", "utf8", "-c", BOOTSTRAP, *site_packages()]
    else:
        argv += [python, "-I", "-B", "-u", "-X", "utf8", "-c", BOOTSTRAP]
    return argv, layers


def _exit_code(returncode: int | None) -> int | None:
    """bwrap reports a child killed by signal N as 128+N; give it back as -N, like subprocess."""
    if returncode is not None and 128 < returncode <= 128 + signal.NSIG:
        return 128 - returncode
    return returncode


def run_strong(
    code: str,
    timeout_s: float,
    memory_mb: int,
    max_processes: int,
    max_output_bytes: int,
    max_file_mb: int,
    max_disk_mb: int,
    python: str | None = None,
    use_cgroup: bool = True,
) -> SandboxResult:
    """Run ``code`` in the bubblewrap sandbox (see the package docstring for what it guarantees)."""
    start = time.perf_counter()
    disk_bytes = max_disk_mb << 20
    limits = snippet_limits(memory_mb, timeout_s, max_file_mb)
    program = filter_program()
    snippet = os.memfd_create("agentgym-snippet")
    filter_read = filter_write = -1
    try:
        with open(snippet, "wb", closefd=False) as f:
            f.write(code.encode("utf-8", errors="surrogatepass"))
        os.lseek(snippet, 0, os.SEEK_SET)
        while True:
            if program is not None:  # bwrap reads the filter from a pipe (the program is far below its size)
                filter_read, filter_write = os.pipe()
                os.write(filter_write, program)
                os.close(filter_write)
            argv, layers = bwrap_argv(python, disk_bytes, filter_read if program is not None else None)
            run_limits = dict(limits)
            # the tasks beyond the code's own: bwrap's monitor and its init (pid 1 inside)
            cgroups, cgroup_layers = (
                make_run_cgroups(max_processes + 2, (memory_mb << 20) + 2 * disk_bytes) if use_cgroup else ([], [])
            )
            layers += ["rlimits", "session", *cgroup_layers]
            if "cgroup" not in cgroup_layers:
                uid = SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
                run_limits.update(capped({resource.RLIMIT_NPROC: user_task_count(uid) + max_processes}))
                layers.append("nproc")
            try:
                outcome = run_child(
                    argv,
                    cwd="/",
                    env={"PATH": PATH},
                    stdin=snippet,
                    preexec=make_preexec(run_limits, [c.join for c in cgroups]),
                    cgroups=cgroups,
                    timeout_s=timeout_s,
                    max_output_bytes=max_output_bytes,
                    pass_fds=(filter_read,) if program is not None else (),
                )
            except subprocess.SubprocessError:  # joining a cgroup failed in the child: retry without
                if cgroups:
                    forget_cgroups()
                    continue
                raise
            finally:
                if program is not None:
                    os.close(filter_read)
            break
    finally:
        os.close(snippet)
    return SandboxResult(
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        exit_code=_exit_code(outcome.returncode),
        timed_out=outcome.timed_out,
        seconds=time.perf_counter() - start,
        output_truncated=outcome.truncated,
        layers=layers,
        mode="strong",
    )


_probe_lock = threading.Lock()
_problem: list[str | None] = []  # [problem] once probed


def strong_problem() -> str | None:
    """Why the strong sandbox cannot run here, or None if it can (probed once per process by
    running a snippet through it)."""
    with _probe_lock:
        if _problem:
            return _problem[0]
        problem: str | None = None
        if not sys.platform.startswith("linux"):
            problem = f"the strong sandbox needs Linux namespaces; this is {sys.platform}"
        elif shutil.which("bwrap") is None:
            problem = "bubblewrap (`bwrap`) is not installed"
        elif os.geteuid() == 0 and shutil.which("setpriv") is None:
            problem = "`setpriv` (util-linux) is not installed; it drops root to an unprivileged user"
        else:
            try:
                result = run_strong(
                    "print('sandbox-ok')",
                    timeout_s=30,
                    memory_mb=1024,
                    max_processes=8,
                    max_output_bytes=4000,
                    max_file_mb=1,
                    max_disk_mb=1,
                )
            except OSError as exc:
                problem = f"starting bwrap failed: {exc}"
            else:
                if result.stdout.strip() != "sandbox-ok":
                    said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-3:]
                    problem = f"bwrap could not start a sandbox here (exit {result.exit_code}): " + " / ".join(said)
        _problem.append(problem)
        return problem


def require_strong() -> None:
    """Raise ``SandboxUnavailable`` (saying what is missing and what to do) unless the strong mode works."""
    problem = strong_problem()
    if problem is not None:
        raise SandboxUnavailable(
            f"The Python tool's strong sandbox cannot run here: {problem}. To fix this, {INSTALL_HINT}."
        )
