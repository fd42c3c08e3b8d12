"""``PythonTool``: run model-written Python in a sandboxed child process (see ``sandbox/``).

The model sends ``{"code": "..."}``; it gets back what the code printed (stdout, then stderr),
cut to ``max_output_chars``. A timeout, a crash or a refused operation comes back as an error
message with the traceback.

What each sandbox mode guarantees (``sandbox=`` option, else ``$AGENTGYM_SANDBOX``, else strong):

* **strong** (default; needs bubblewrap): an isolation boundary. The code runs as an
  unprivileged user (``nobody`` when agentgym runs as root) with no capabilities, in new PID,
  mount, network, IPC and UTS namespaces, behind a seccomp filter. It sees a read-only system
  (``/usr``, the interpreter and its packages) and a private, size-capped ``/tmp`` (its working
  directory) and ``/dev/shm``; not the host's other files, processes, environment or network.
  Time, CPU, memory, file size, disk and processes are capped, and every process it started is
  killed when the call ends. If bubblewrap cannot run here, building the tool raises
  ``SandboxUnavailable`` naming what is missing - it never silently falls back.
* **weak** (opt-in: ``AGENTGYM_SANDBOX=weak``): an in-process audit hook plus resource limits.
  It stops honest mistakes (writing outside the scratch directory, network, subprocesses) but
  is no boundary: hostile code can switch the hook off and act with the caller's privileges.

The full list, and what is not covered, is in ``agentgym/envs/tools/sandbox/__init__.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentgym.envs.tools.base import Tool, ToolError
from agentgym.envs.tools.calls import truncate
from agentgym.envs.tools.sandbox import SandboxResult, check_mode, run_python


def describe(result: SandboxResult, max_chars: int) -> str:
    """What the model reads: stdout, then stderr, truncated; a note if there was no output."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    text = "\n".join(parts)
    if result.output_truncated:
        text += "\n... [output truncated]"
    return truncate(text, max_chars) if text else ""


class PythonTool(Tool):
    """Run Python code in a sandbox and return what it prints."""

    name: ClassVar[str] = "python"
    # What the model is told, per sandbox mode (each states only what that mode enforces).
    DESCRIPTIONS: ClassVar[dict[str, str]] = {
        "strong": "Run a Python 3 program and return what it prints (stdout and stderr). Use print() to see values. "
        "Each call starts fresh in an isolated sandbox without network: the working directory (/tmp) is "
        "private and emptied after the call, the rest of the file system is read-only, and time, memory, "
        "disk and processes are limited.",
        "weak": "Run a Python 3 program and return what it prints (stdout and stderr). Use print() to see values. "
        "No network, no subprocesses, no writing outside the working directory; each call starts fresh.",
    }
    description: ClassVar[str] = DESCRIPTIONS["strong"]
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the Python program to run"}},
        "required": ["code"],
    }

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 1024,
        max_processes: int = 16,
        max_output_chars: int = 4000,
        max_file_mb: int = 16,
        isolate_network: bool = True,
        use_cgroup: bool = True,
        max_disk_mb: int = 64,
        sandbox: str | None = None,
    ) -> None:
        """Limits per call: wall-clock ``timeout_s``, address space ``memory_mb``, processes+threads
        ``max_processes``, ``max_output_chars`` of output returned, files up to ``max_file_mb``,
        ``max_disk_mb`` of /tmp and of /dev/shm (strong mode). ``sandbox``: ``"strong"`` or ``"weak"``
        (default: ``$AGENTGYM_SANDBOX``, else strong). Raises ``SandboxUnavailable`` if the strong
        mode is chosen and cannot run here."""
        self.mode = check_mode(sandbox)
        if self.mode != "strong":
            self.description = self.DESCRIPTIONS[self.mode]  # type: ignore[misc]
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_processes = max_processes
        self.max_output_chars = max_output_chars
        self.max_file_mb = max_file_mb
        self.isolate_network = isolate_network
        self.use_cgroup = use_cgroup
        self.max_disk_mb = max_disk_mb

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` under this tool's limits; the raw result."""
        return run_python(
            code,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_output_bytes=4 * self.max_output_chars,
            max_file_mb=self.max_file_mb,
            isolate_network=self.isolate_network,
            use_cgroup=self.use_cgroup,
            max_disk_mb=self.max_disk_mb,
            mode=self.mode,
        )

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError('python needs {"code": "<program>"}', kind="bad_arguments")
        result = self.run(code)
        metrics = {
            "python_seconds": result.seconds,
            "python_timeouts": float(result.timed_out),
            "python_failures": float(not result.ok),
        }
        output = describe(result, self.max_output_chars)
        if result.timed_out:
            tail = f"\nOutput before the timeout:\n{output}" if output else ""
            raise ToolError(
                f"the program did not finish within {self.timeout_s:g} s and was stopped.{tail}",
                kind="timeout",
                metrics=metrics,
            )
        if result.exit_code != 0:
            how = (
                f"was killed by signal {-result.exit_code}"
                if (result.exit_code or 0) < 0
                else f"exited with status {result.exit_code}"
            )
            raise ToolError(f"the program {how}.\n{output}".rstrip(), kind="code_error", metrics=metrics)
        return output or "(no output: use print() to show results)", 0.0, metrics
