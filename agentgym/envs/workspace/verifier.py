"""The verifier: a task's checks, run against the final workspace where the agent can no longer act.

When an episode ends (``submit``, the turn budget, a dead sandbox), the env takes the workspace out
of the episode's sandbox as a tar and kills that sandbox: every process the agent started is gone.
``verify`` then starts a *fresh* sandbox (the same boundary), unpacks the workspace into it, adds the
task's ``verifier_files`` (files the agent never saw: they exist nowhere before this point, and are
written without following anything the agent left in their way - a symlinked directory, a file in a
directory's place), and runs each ``Check``:

* ``command``: run with ``bash -c`` in ``/workspace``, within the check's ``timeout_s``; passes on exit 0.
* ``file``: the file at ``path`` holds exactly ``content`` (``content=None``: the file must not exist).
* ``answer``: the ``submit`` answer equals ``answer`` after stripping whitespace (no sandbox needed).

The reward is 1.0 when every check passes, else 0.0; the per-check report goes to ``info``.
What the agent *can* still influence is the workspace itself, by design: a command check that
imports workspace code runs the agent's code (as in SWE-bench). Write checks that read the
workspace's state, and keep the test files among ``verifier_files``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from agentgym.envs.workspace.sandbox import WorkspaceError, WorkspaceLimits, WorkspaceSandbox
from agentgym.envs.workspace.task import Check, WorkspaceTask

MAX_DETAIL_CHARS = 2000


@dataclass
class CheckResult:
    """One check's verdict."""

    index: int
    kind: str
    passed: bool
    detail: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class VerifierReport:
    """All checks' verdicts; ``error`` when the verifier itself could not run (every check then fails)."""

    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0

    def metrics(self) -> dict[str, float]:
        out = {
            "checks_passed": float(sum(c.passed for c in self.checks)),
            "checks_total": float(len(self.checks)),
            "verifier_seconds": self.seconds,
            "verifier_errors": float(self.error is not None),
        }
        for c in self.checks:
            out[f"check/{c.index}"] = float(c.passed)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "error": self.error,
            "seconds": self.seconds,
            "checks": [c.as_dict() for c in self.checks],
        }


def _tail(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else "..." + text[-MAX_DETAIL_CHARS:]


def _run_check(index: int, check: Check, sandbox: WorkspaceSandbox | None, answer: str | None) -> CheckResult:
    start = time.perf_counter()
    if check.kind == "answer":
        expected = (check.answer or "").strip()
        got = None if answer is None else answer.strip()
        passed = got == expected
        detail = "" if passed else f"expected answer {expected[:200]!r}, got {None if got is None else got[:200]!r}"
        return CheckResult(index, check.kind, passed, detail, time.perf_counter() - start)
    assert sandbox is not None
    if check.kind == "command":
        if not check.command:
            return CheckResult(index, check.kind, False, "the check has no command")
        result = sandbox.run(check.command, timeout_s=check.timeout_s, cwd="/workspace")
        if result.timed_out:
            detail = f"timed out after {check.timeout_s:g} s\n{result.output}"
        else:
            detail = f"exit code {result.exit_code}\n{result.output}"
        return CheckResult(index, check.kind, result.ok, _tail(detail.strip()), time.perf_counter() - start)
    if check.kind == "file":
        if not check.path:
            return CheckResult(index, check.kind, False, "the check has no path")
        try:
            read = sandbox.read(check.path)
        except ValueError as exc:
            return CheckResult(index, check.kind, False, str(exc), time.perf_counter() - start)
        if check.content is None:
            passed = not read.exists
            detail = "" if passed else f"{check.path} exists but must not"
        elif not read.exists:
            passed, detail = False, f"{check.path} does not exist"
        else:
            passed = read.data == check.content.encode("utf-8", errors="surrogatepass")
            detail = "" if passed else f"{check.path} differs from the expected content"
        return CheckResult(index, check.kind, passed, detail, time.perf_counter() - start)
    return CheckResult(index, str(check.kind), False, f"unknown check kind {check.kind!r}")


def verify(
    task: WorkspaceTask, archive: bytes | None, answer: str | None, limits: WorkspaceLimits | None = None
) -> VerifierReport:
    """Run ``task.checks`` against the workspace in ``archive`` (a tar from ``WorkspaceSandbox.archive``;
    None: the workspace was lost, so only answer checks can pass) plus ``task.verifier_files``, in a
    fresh sandbox under ``limits``."""
    start = time.perf_counter()
    report = VerifierReport()
    if not task.checks:
        report.error = f"task {task.task_id!r} has no checks"
        return report
    needs_sandbox = any(c.kind != "answer" for c in task.checks)
    sandbox: WorkspaceSandbox | None = None
    try:
        if needs_sandbox:
            if archive is None:
                raise WorkspaceError("the episode's workspace was lost (its sandbox died)")
            slowest = max((c.timeout_s for c in task.checks if c.kind == "command"), default=1.0)
            base = limits or WorkspaceLimits()
            # room for the verifier's files even when the agent filled its workspace to the brim
            room = (
                base.max_disk_mb
                + (sum(len(t.encode("utf-8", "surrogatepass")) for t in task.verifier_files.values()) >> 20)
                + 8
            )
            sandbox = WorkspaceSandbox(
                dataclasses.replace(base, timeout_s=max(base.timeout_s, slowest), max_disk_mb=room)
            )
            sandbox.extract(archive)
            for path, content in task.verifier_files.items():
                sandbox.write(path, content, force=True)
        for i, check in enumerate(task.checks):
            report.checks.append(_run_check(i, check, sandbox, answer))
    except (WorkspaceError, ValueError) as exc:
        report.error = f"the verifier could not run: {exc}"
        done = {c.index for c in report.checks}
        for i, check in enumerate(task.checks):
            if i not in done:
                passed = check.kind == "answer" and _run_check(i, check, None, answer).passed
                report.checks.append(CheckResult(i, check.kind, passed, "not run: " + report.error))
    finally:
        if sandbox is not None:
            sandbox.close()
        report.seconds = time.perf_counter() - start
    return report
