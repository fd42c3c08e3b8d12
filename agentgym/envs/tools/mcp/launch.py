"""Start an MCP stdio server under agentgym's process guarantees, then become it (``exec``).

Run as a script (stdlib only, so it starts in milliseconds)::

    python launch.py --parent PID [--memory-mb N] -- COMMAND [ARGS...]

Before ``exec``: the server is killed (SIGKILL) when the agentgym thread that started it dies
(``PR_SET_PDEATHSIG``; the launcher exits at once if that parent is already gone), writes no core
files, and with ``--memory-mb`` its address space is capped (``RLIMIT_AS``). The MCP SDK has already
put it in its own session and process group, which agentgym kills as a whole on close. agentgym finds
the process (and its group) again by a variable in its environment, which ``exec`` keeps.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: launch.py --parent PID [--memory-mb N] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    values = dict(zip(options[::2], options[1::2]))
    if not command:
        print("launch.py: no command after --", file=sys.stderr)
        return 2
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = values.get("--parent")
    if parent is not None and os.getppid() != int(parent):
        return 1  # agentgym died before the death signal was armed
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    memory_mb = values.get("--memory-mb")
    if memory_mb:
        limit = int(memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"agentgym: cannot start the MCP server {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
