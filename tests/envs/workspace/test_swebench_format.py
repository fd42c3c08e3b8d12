from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.envs.workspace.expert_calls import submit
from agentgym.envs.workspace.formats import UnsupportedTask
from agentgym.envs.workspace.formats.swebench import SweBenchTasks, load_instances, swebench_task
from tests.support.workspace_harness import check_results, play

NEEDS_SANDBOX = False  # played in a plain temporary directory (tests/support/workspace_harness.py)

DATA = Path(__file__).parent / "data" / "swebench"
INSTANCES = DATA / "instances.jsonl"


def _instance() -> dict:
    return load_instances(INSTANCES)[0]


def test_instance_parses_into_a_workspace_task():
    task = SweBenchTasks(INSTANCES)(0)
    assert task.task_id == "swebench/minicalc__minicalc-1"
    assert task.instruction.startswith("divide(1, 0) raises ZeroDivisionError")
    assert set(task.files) == {"minicalc/__init__.py", "minicalc/ops.py", "tests/__init__.py", "tests/check_ops.py"}
    assert "test_divide_by_zero" not in task.files["tests/check_ops.py"]  # the test patch is hidden
    assert list(task.verifier_files) == ["tests/check_ops.py"]
    assert "def test_divide_by_zero" in task.verifier_files["tests/check_ops.py"]
    assert [c.command for c in task.checks] == [
        "python3 -m unittest tests.check_ops.TestOps.test_divide_by_zero",
        "python3 -m unittest tests.check_ops.TestOps.test_add tests.check_ops.TestOps.test_divide "
        "tests.check_ops.TestOps.test_mean",
    ]
    assert [c["name"] for c in task.expert] == ["write_file", "submit"]
    assert task.expert[0]["arguments"]["path"] == "minicalc/ops.py"
    assert "if b == 0:" in task.expert[0]["arguments"]["content"]


def test_gold_patch_passes_and_the_snapshot_fails(tmp_path):
    task = SweBenchTasks(INSTANCES)(0)
    assert check_results(task, play(task, tmp_path / "gold")) == [True, True]
    assert check_results(task, play(task, tmp_path / "idle", calls=[submit()])) == [False, True]


def test_editing_the_test_file_does_not_help(tmp_path):
    task = SweBenchTasks(INSTANCES)(0)
    cheat = [{"name": "write_file", "arguments": {"path": "tests/check_ops.py", "content": ""}}, submit()]
    assert check_results(task, play(task, tmp_path, calls=cheat))[0] is False


def test_files_field_hf_style_ids_and_test_cmd():
    row = _instance()
    snapshot = {
        p.relative_to(DATA / "repos/minicalc").as_posix(): p.read_text()
        for p in (DATA / "repos/minicalc").rglob("*.py")
    }
    row = {
        **row,
        "files": snapshot,
        "repo_dir": None,
        "FAIL_TO_PASS": ["test_divide_by_zero (tests.check_ops.TestOps)"],
    }
    row["PASS_TO_PASS"], row["test_cmd"] = "[]", "python3 -m unittest -v"
    task = swebench_task(row)
    assert [c.command for c in task.checks] == ["python3 -m unittest -v tests.check_ops.TestOps.test_divide_by_zero"]
    pytest_ids = {**row, "test_cmd": None, "FAIL_TO_PASS": '["tests/check_ops.py::test_x"]'}
    assert swebench_task(pytest_ids).checks[0].command.startswith("python3 -m pytest -q")


def test_what_cannot_run_is_refused_with_the_reason(tmp_path):
    row = _instance()
    with pytest.raises(UnsupportedTask, match="does not clone"):
        swebench_task({**row, "repo_dir": None})
    with pytest.raises(UnsupportedTask, match="test_patch does not apply"):
        swebench_task(
            {**row, "test_patch": row["test_patch"].replace("self.assertEqual(divide(6, 3), 2)", "nope")}, DATA
        )
    with pytest.raises(ValueError, match="missing FAIL_TO_PASS"):
        swebench_task({**row, "FAIL_TO_PASS": None}, DATA)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({**row, "repo_dir": None})
        + "\n"
        + json.dumps({**row, "repo_dir": str(DATA / "repos/minicalc")})
        + "\n"
    )
    with pytest.raises(UnsupportedTask, match="1 of 2 instance"):
        SweBenchTasks(bad)
    with pytest.warns(UserWarning, match="left out 1"):
        assert len(SweBenchTasks(bad, skip_unsupported=True)) == 1
