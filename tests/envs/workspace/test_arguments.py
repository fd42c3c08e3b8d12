"""The workspace tools' argument checks: pure (no sandbox needed), each failure said, and bounded on
generated input (the tools' part of the fuzz lane; ``benchmarks/fuzz_doors.py`` has the door
``workspace.arguments``)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from agentgym.envs.tools.base import ToolError
from agentgym.envs.workspace.tools import WORKSPACE_TOOLS, check_arguments

NEEDS_SANDBOX = False


# ---- argument checks: no sandbox ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("bash", {}, "needs 'command'"),
        ("bash", {"command": "   "}, "non-empty"),
        ("bash", {"command": ["ls"]}, "needs 'command'"),
        ("read_file", {"path": ""}, "needs 'path'"),
        ("read_file", {"path": "/etc/passwd"}, "outside the workspace"),
        ("read_file", {"path": "a", "start_line": 0}, "counts from 1"),
        ("read_file", {"path": "a", "start_line": 5, "end_line": 2}, "before"),
        ("read_file", {"path": "a", "start_line": "x"}, "line number"),
        ("read_file", {"path": "a", "start_line": True}, "line number"),
        ("write_file", {"path": "a"}, "needs 'content'"),
        ("write_file", {"path": "a\0b", "content": ""}, "without NUL"),
        ("write_file", {"path": "x" * 5000, "content": ""}, "characters"),
        ("str_replace", {"path": "a", "old_str": "", "new_str": "b"}, "needs 'old_str'"),
        ("str_replace", {"path": "a", "old_str": "x"}, "needs 'new_str'"),
        ("submit", {"answer": {"a": 1}}, "must be a string"),
        ("nope", {}, "unknown workspace tool"),
    ],
)
def test_bad_arguments_say_what_is_wrong(name: str, arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        check_arguments(name, arguments)


def test_good_arguments_come_back_normalised() -> None:
    assert check_arguments("read_file", {"path": "a.py", "start_line": "3", "end_line": -1}) == {
        "path": "a.py",
        "start_line": 3,
        "end_line": -1,
    }
    assert check_arguments("submit", {"answer": 42}) == {"answer": "42"}
    assert check_arguments("submit", {}) == {"answer": None}
    assert check_arguments("write_file", {"path": "/workspace/x", "content": ""})["path"] == "/workspace/x"


def test_argument_checks_are_bounded_on_generated_input() -> None:
    """The fuzz lane for the tools' argument parsing: any JSON-like arguments either pass or raise
    ToolError, quickly (the checks are linear; 1 MB strings included)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=200),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
    keys = st.sampled_from(["command", "path", "content", "old_str", "new_str", "start_line", "end_line", "answer"])

    @settings(max_examples=300, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(WORKSPACE_TOOLS), st.dictionaries(keys, values, max_size=5))
    def check(name: str, arguments: dict[str, Any]) -> None:
        start = time.thread_time()
        with contextlib.suppress(ToolError):
            check_arguments(name, arguments)
        assert time.thread_time() - start < 0.05

    check()
    start = time.thread_time()
    for name in WORKSPACE_TOOLS:
        big = {"command": "x" * (1 << 20), "path": "a/" * 100_000, "content": "y" * (1 << 20), "old_str": "z"}
        with contextlib.suppress(ToolError):
            check_arguments(name, {**big, "new_str": "w", "start_line": "9" * 11})
    assert time.thread_time() - start < 0.5


# ---- the host's reading of the server's replies -----------------------------------------------------
def test_reply_lines_parse_without_evaluating_anything() -> None:
    from agentgym.envs.workspace.sandbox import WorkspaceError, parse_reply_line

    fields, strings = parse_reply_line(b"exit_code=~ timed_out=?1 seconds=0.25 n=-3 output=@12 cwd=@10 size=0")
    assert fields == {"exit_code": None, "timed_out": True, "seconds": 0.25, "n": -3, "size": 0}
    assert strings == [("output", 12), ("cwd", 10)]
    for bad in (b"x=__import__('os')", b"=1", b"a b", b"x=" + b"9" * 100, b"x=@-1"):
        with pytest.raises(WorkspaceError, match="malformed"):
            parse_reply_line(bad)
