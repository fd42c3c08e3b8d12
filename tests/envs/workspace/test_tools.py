"""The workspace tools on a real workspace: line-numbered reads and ranges, the editor's exactly-once
rule, writes that stay inside, bash's exit code, submit."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentgym.envs.tools import Toolbox
from agentgym.envs.workspace.sandbox import WorkspaceLimits, WorkspaceSandbox
from agentgym.envs.workspace.tools import WorkspaceHandle, make_workspace_tools


# ---- the tools on a workspace ---------------------------------------------------------------------
@pytest.fixture
def toolbox() -> Toolbox:
    handle = WorkspaceHandle(
        WorkspaceSandbox(WorkspaceLimits(timeout_s=5.0, max_disk_mb=8), {"f.py": "a = 1\nb = 2\na = 1\nc = 3\n"})
    )
    box = Toolbox(make_workspace_tools(handle, max_output_chars=2000), max_output_chars=2000, call_timeout_s=None)
    yield box
    assert handle.sandbox is not None
    handle.sandbox.close()


def run(toolbox: Toolbox, name: str, **arguments: Any) -> tuple[str, str | None]:
    result = toolbox.execute({"id": "c", "function": {"name": name, "arguments": arguments}})
    return result.text, result.error


def test_read_file_numbers_lines_and_shows_ranges(toolbox: Toolbox) -> None:
    assert run(toolbox, "read_file", path="f.py")[0] == "     1\ta = 1\n     2\tb = 2\n     3\ta = 1\n     4\tc = 3"
    assert run(toolbox, "read_file", path="f.py", start_line=2, end_line=3)[0] == "     2\tb = 2\n     3\ta = 1"
    assert run(toolbox, "read_file", path="f.py", start_line=4, end_line=-1)[0] == "     4\tc = 3"
    assert run(toolbox, "read_file", path="missing.py")[1] == "not_found"
    assert "past the end" in run(toolbox, "read_file", path="f.py", start_line=9)[0]


def test_str_replace_needs_exactly_one_occurrence_and_leaves_the_file_alone_otherwise(toolbox: Toolbox) -> None:
    text, error = run(toolbox, "str_replace", path="f.py", old_str="a = 1", new_str="a = 9")
    assert error == "no_unique_match" and "occurs 2 times" in text
    text, error = run(toolbox, "str_replace", path="f.py", old_str="zzz", new_str="a = 9")
    assert error == "no_unique_match" and "does not occur" in text
    assert run(toolbox, "bash", command="cat f.py")[0].startswith("a = 1\nb = 2\na = 1\nc = 3")
    text, error = run(toolbox, "str_replace", path="f.py", old_str="a = 1\nc", new_str="a = 7\nc")
    assert error is None and "     3\ta = 7" in text
    assert run(toolbox, "bash", command="cat f.py")[0] == "a = 1\nb = 2\na = 7\nc = 3\n[exit code: 0]"


def test_write_file_makes_parents_and_stays_inside(toolbox: Toolbox) -> None:
    assert run(toolbox, "write_file", path="new/dir/g.txt", content="hi")[1] is None
    assert run(toolbox, "bash", command="cat new/dir/g.txt")[0] == "hi\n[exit code: 0]"
    assert run(toolbox, "write_file", path="../../etc/x", content="hi")[1] == "refused"
    run(toolbox, "bash", command="ln -s /etc e")
    text, error = run(toolbox, "write_file", path="e/x", content="hi")
    assert error == "refused" and "outside the workspace" in text


def test_bash_reports_the_exit_code(toolbox: Toolbox) -> None:
    assert run(toolbox, "bash", command="echo hi; false")[0] == "hi\n[exit code: 1]"


def test_submit_marks_the_handle(toolbox: Toolbox) -> None:
    handle = toolbox.tools["submit"].handle  # type: ignore[attr-defined]
    assert run(toolbox, "submit", answer=" 7 ")[1] is None
    assert handle.submitted and handle.answer == " 7 "


def test_a_huge_file_is_refused_not_read_whole(toolbox: Toolbox) -> None:
    run(toolbox, "bash", command="head -c 6000000 /dev/zero | tr '\\0' 'a' > big.txt")
    start = time.perf_counter()
    text, error = run(toolbox, "read_file", path="big.txt")
    assert error == "too_large" and "bash" in text
    assert run(toolbox, "str_replace", path="big.txt", old_str="a", new_str="b")[1] == "too_large"
    assert time.perf_counter() - start < 5.0
