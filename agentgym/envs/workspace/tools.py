"""The workspace tools: ``bash``, ``read_file``, ``write_file``, ``str_replace``, ``submit``.

The shapes of SWE-agent / OpenHands / mini-swe-agent: one shell command per call, a file viewer
with line numbers, whole-file writes, and an editor whose ``old_str`` must occur exactly once.
Every tool acts on the episode's ``WorkspaceSandbox`` (see ``sandbox.py``), which the env swaps at
each reset: a tool holds a ``WorkspaceHandle`` and reads ``handle.sandbox`` on each call. File
paths are relative to ``/workspace`` (absolute ones must lie in it); the sandbox's server resolves
symlinks and refuses any path that ends up outside. Argument checking is pure and linear in the
arguments' size (``check_arguments``), so it sits in the fuzz lane with the other doors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentgym.envs.tools.base import Tool, ToolError
from agentgym.envs.workspace.sandbox import WORKSPACE, WorkspaceError, WorkspaceSandbox

MAX_PATH_CHARS = 4096
MAX_TEXT_BYTES = 4 << 20  # read_file / str_replace take files up to this size (the host decodes and numbers them)
WORKSPACE_TOOLS = ("bash", "read_file", "write_file", "str_replace", "submit")


@dataclass
class WorkspaceHandle:
    """What the tools share with the env: the episode's sandbox and whether (and what) it submitted."""

    sandbox: WorkspaceSandbox | None = None
    submitted: bool = False
    answer: str | None = None
    calls: dict[str, int] = field(default_factory=dict)

    def require(self) -> WorkspaceSandbox:
        if self.sandbox is None:
            raise ToolError("there is no workspace: the episode has ended", kind="no_workspace")
        return self.sandbox


def _string(arguments: dict[str, Any], key: str, tool: str, required: bool = True, empty: bool = True) -> str | None:
    value = arguments.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (not empty and not value):
        want = "a non-empty string" if not empty else "a string"
        raise ToolError(f"{tool} needs {key!r}: {want}", kind="bad_arguments")
    return value


def _path(arguments: dict[str, Any], tool: str) -> str:
    path = _string(arguments, "path", tool, empty=False)
    assert path is not None
    if len(path) > MAX_PATH_CHARS or "\0" in path:
        raise ToolError(f"{tool}: 'path' must be under {MAX_PATH_CHARS} characters, without NUL", kind="bad_arguments")
    if path.startswith("/") and path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
        raise ToolError(f"{tool}: {path!r} is outside the workspace ({WORKSPACE})", kind="outside_workspace")
    return path


def _line(arguments: dict[str, Any], key: str) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 12:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 10**9:
        raise ToolError(f"read_file: {key!r} must be a line number (an integer)", kind="bad_arguments")
    return value


def check_arguments(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The checked arguments of a workspace tool call (raises ``ToolError`` saying what is wrong).
    Pure: no sandbox needed, linear in the arguments' size."""
    if name == "bash":
        command = _string(arguments, "command", name, empty=False)
        assert command is not None
        if not command.strip():
            raise ToolError("bash needs a non-empty 'command'", kind="bad_arguments")
        return {"command": command}
    if name == "read_file":
        start, end = _line(arguments, "start_line"), _line(arguments, "end_line")
        if start is not None and start < 1:
            raise ToolError("read_file: 'start_line' counts from 1", kind="bad_arguments")
        if end is not None and end != -1 and start is not None and end < start:
            raise ToolError("read_file: 'end_line' is before 'start_line'", kind="bad_arguments")
        return {"path": _path(arguments, name), "start_line": start, "end_line": end}
    if name == "write_file":
        return {"path": _path(arguments, name), "content": _string(arguments, "content", name)}
    if name == "str_replace":
        old = _string(arguments, "old_str", name, empty=False)
        new = _string(arguments, "new_str", name)
        return {"path": _path(arguments, name), "old_str": old, "new_str": new}
    if name == "submit":
        answer = arguments.get("answer")
        if answer is not None and not isinstance(answer, (str, int, float)):
            raise ToolError("submit: 'answer' must be a string", kind="bad_arguments")
        return {"answer": None if answer is None else str(answer)}
    raise ToolError(f"unknown workspace tool {name[:80]!r}", kind="unknown_tool")


def number_lines(text: str, start: int = 1) -> str:
    """``text`` with ``cat -n`` style line numbers from ``start``."""
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.split("\n"), start))


class WorkspaceTool(Tool):
    """Base of the workspace tools: a handle to the episode's sandbox, checked arguments, and the
    sandbox's failures turned into messages for the model."""

    def __init__(self, handle: WorkspaceHandle, max_output_chars: int = 8000) -> None:
        self.handle = handle
        self.max_output_chars = max_output_chars

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        checked = check_arguments(self.name, arguments)
        self.handle.calls[self.name] = self.handle.calls.get(self.name, 0) + 1
        try:
            return self.act(checked)
        except WorkspaceError as exc:
            raise ToolError(f"the workspace failed: {exc}", kind="workspace_died") from None
        except ValueError as exc:  # the server's refusal (a path outside, a directory, ...)
            raise ToolError(f"{self.name}: {exc}", kind="refused") from None

    def act(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        raise NotImplementedError

    def read_text(self, path: str) -> str:
        sandbox = self.handle.require()
        read = sandbox.read(path, max_bytes=MAX_TEXT_BYTES)
        if not read.exists:
            raise ToolError(f"{self.name}: {path!r} does not exist", kind="not_found")
        if read.truncated:
            raise ToolError(
                f"{self.name}: {path!r} is {read.size} bytes, over {MAX_TEXT_BYTES >> 20} MB; "
                "look at parts of it with bash (head, sed -n, grep)",
                kind="too_large",
            )
        try:
            return read.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{self.name}: {path!r} is not UTF-8 text", kind="binary_file") from None


class BashTool(WorkspaceTool):
    name: ClassVar[str] = "bash"
    description: ClassVar[str] = (
        "Run one bash command in the workspace (/workspace) and return its output (stdout and stderr) and "
        "exit code. The working directory persists between calls (cd works); files persist for the episode. "
        "No network; time, memory, output and processes are limited, and background processes are stopped "
        "when the command returns. Non-interactive: stdin is empty."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the bash command to run"}},
        "required": ["command"],
    }

    def act(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        result = self.handle.require().run(arguments["command"])
        metrics = {"bash_seconds": result.seconds, "bash_timeouts": float(result.timed_out)}
        output = result.output.rstrip("\n")
        if result.truncated:
            output += "\n... [output truncated]"
        if result.timed_out:
            tail = f"\nOutput before the timeout:\n{output}" if output else ""
            limit = self.handle.require().limits.timeout_s
            raise ToolError(f"the command did not finish within {limit:g} s and was stopped.{tail}", "timeout", metrics)
        return f"{output}\n[exit code: {result.exit_code}]".lstrip("\n"), 0.0, metrics


class ReadFileTool(WorkspaceTool):
    name: ClassVar[str] = "read_file"
    description: ClassVar[str] = (
        "Show a text file of the workspace with line numbers. Optional start_line and end_line (1-based, "
        "inclusive; end_line -1: to the end) show a part."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "file path, relative to /workspace"},
            "start_line": {"type": "integer", "description": "first line to show (1-based)"},
            "end_line": {"type": "integer", "description": "last line to show (inclusive; -1: the end)"},
        },
        "required": ["path"],
    }

    def act(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        text = self.read_text(arguments["path"])
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        start = arguments["start_line"] or 1
        end = arguments["end_line"]
        end = len(lines) if end is None or end == -1 else min(end, len(lines))
        if lines and start > len(lines):
            raise ToolError(f"read_file: start_line {start} is past the end ({len(lines)} lines)", "bad_arguments")
        shown = number_lines("\n".join(lines[start - 1 : end]), start) if lines else "(empty file)"
        if len(shown) > self.max_output_chars:
            shown = shown[: self.max_output_chars] + "\n... [truncated: read a smaller range with start_line/end_line]"
        return shown, 0.0, {}


class WriteFileTool(WorkspaceTool):
    name: ClassVar[str] = "write_file"
    description: ClassVar[str] = (
        "Create or overwrite a workspace file with the given content (parent directories made)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "file path, relative to /workspace"},
            "content": {"type": "string", "description": "the file's full new content"},
        },
        "required": ["path", "content"],
    }

    def act(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        written = self.handle.require().write(arguments["path"], arguments["content"])
        return f"Wrote {len(arguments['content'])} characters to {written}.", 0.0, {}


class StrReplaceTool(WorkspaceTool):
    name: ClassVar[str] = "str_replace"
    description: ClassVar[str] = (
        "Edit a workspace file: replace old_str with new_str. old_str must occur exactly once in the file "
        "(include enough surrounding lines to make it unique); whitespace counts."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "file path, relative to /workspace"},
            "old_str": {"type": "string", "description": "the exact text to replace (must occur once)"},
            "new_str": {"type": "string", "description": "the text to put in its place"},
        },
        "required": ["path", "old_str", "new_str"],
    }

    def act(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        path, old, new = arguments["path"], arguments["old_str"], arguments["new_str"]
        text = self.read_text(path)
        count = text.count(old)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise ToolError(f"str_replace: old_str {where} in {path}; it must occur exactly once", "no_unique_match")
        at = text.index(old)
        edited = text[:at] + new + text[at + len(old) :]
        self.handle.require().write(path, edited)
        first = text.count("\n", 0, at)  # 0-based line of the edit
        lines = edited.split("\n")
        lo, hi = max(0, first - 3), min(len(lines), first + new.count("\n") + 4)
        snippet = number_lines("\n".join(lines[lo:hi]), lo + 1)
        if len(snippet) > self.max_output_chars:
            snippet = snippet[: self.max_output_chars] + "\n... [truncated]"
        return f"Edited {path}. The lines around the edit:\n{snippet}", 0.0, {}


class SubmitTool(WorkspaceTool):
    name: ClassVar[str] = "submit"
    description: ClassVar[str] = (
        "Finish the task: call this once the work in the workspace is done (with an answer if the task asks "
        "for one). The episode ends and the work is checked."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the answer, if the task asks for one"}},
        "required": [],
    }

    def act(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        self.handle.submitted = True
        self.handle.answer = arguments["answer"]
        return "Submitted. The episode is over.", 0.0, {}


TOOL_CLASSES: dict[str, type[WorkspaceTool]] = {
    cls.name: cls for cls in (BashTool, ReadFileTool, WriteFileTool, StrReplaceTool, SubmitTool)
}


def make_workspace_tools(handle: WorkspaceHandle, max_output_chars: int = 8000) -> list[WorkspaceTool]:
    """All five tools, sharing ``handle``."""
    return [TOOL_CLASSES[name](handle, max_output_chars) for name in WORKSPACE_TOOLS]
