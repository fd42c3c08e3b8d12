from __future__ import annotations

import random

import pytest

from agentgym.envs.workspace.expert_calls import submit, write_file
from agentgym.envs.workspace.suites.swe import BUG_KINDS, FUNCTIONS, SweSuite
from tests.support.workspace_harness import check_results, play

NEEDS_SANDBOX = False  # played in a plain temporary directory (tests/support/workspace_harness.py)

BUGS = [(f, bug) for f in FUNCTIONS for bug in f.bugs]


@pytest.mark.parametrize("function,bug", BUGS, ids=[f"{f.name}-{b[0]}" for f, b in BUGS])
def test_every_bug_fails_the_visible_tests_and_the_expert_fixes_it(function, bug, tmp_path):
    task = SweSuite().build(3, random.Random(3), function, bug)
    assert [c["name"] for c in task.expert] == ["read_file", "str_replace", "submit"]
    assert task.expert[0]["arguments"]["path"] == task.metadata["path"]
    before = check_results(task, play(task, tmp_path / "before", calls=[submit()]))
    assert before[0] is False  # the visible tests fail with the bug in
    hidden = [ok for ok, c in zip(before, task.checks) if c.command and ".verifier/" in c.command]
    assert len(hidden) == 2 and False in hidden  # and so do the hidden ones
    after = play(task, tmp_path / "after")
    assert all(check_results(task, after)), task.instruction
    assert function.name in task.instruction and bug[3] in task.instruction


@pytest.mark.parametrize("modules", [1, 2])
def test_the_issue_names_the_file_the_expert_reads(modules):
    # the expert's first call must not know more than the agent: demos that read an unnamed module teach a guess
    for seed in range(40):
        task = SweSuite(modules=modules, functions_per_module=2)(seed)
        assert task.expert[0]["arguments"]["path"] in task.instruction, task.instruction


def test_editing_the_tests_fails_the_check(tmp_path):
    task = SweSuite()(11)
    test_path = next(p for p in task.files if p.startswith("tests/test_"))
    cheat = [write_file(test_path, "import unittest\n"), submit()]
    results = check_results(task, play(task, tmp_path, calls=cheat))
    assert not all(results)
    assert results[[c.path for c in task.checks].index(test_path)] is False


def test_seeds_draw_kinds_packages_and_layouts():
    suite = SweSuite()
    assert suite(5) == suite(5)
    tasks = [suite(s) for s in range(60)]
    assert {t.metadata["kind"] for t in tasks} == set(BUG_KINDS)
    assert len({t.metadata["function"] for t in tasks}) == len(FUNCTIONS)
    assert all(len([p for p in t.files if p.startswith("tests/test_")]) == 2 for t in tasks)
    assert all(t.verifier_files and not set(t.verifier_files) & set(t.files) for t in tasks)
    one = SweSuite(bug_kinds="off_by_one", modules=1, functions_per_module=2)(0)
    assert one.metadata["kind"] == "off_by_one" and len([p for p in one.files if p.endswith(".py")]) == 4


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="missing_case"):
        SweSuite(bug_kinds=["typo"])
    with pytest.raises(ValueError, match="modules"):
        SweSuite(modules=3)


def test_modules_hold_functions_per_module():
    task = SweSuite(modules=2, functions_per_module=3)(4)
    modules = [p for p in task.files if p.endswith(".py") and not p.startswith("tests/") and "__init__" not in p]
    assert [task.files[m].count("\ndef ") + task.files[m].startswith("def ") for m in modules] == [3, 3]


@pytest.mark.parametrize("function,bug", BUGS, ids=[f"{f.name}-{b[0]}" for f, b in BUGS])
def test_the_expert_edits_only_the_bugs_lines(function, bug):
    # the fewest tokens for a small model to write: the bug's own lines; a deleted case anchors on the line before
    task = SweSuite().build(3, random.Random(3), function, bug)
    edit = task.expert[1]["arguments"]
    source = task.files[task.metadata["path"]]
    assert source.count(edit["old_str"]) == 1
    if bug[2] and source.count(bug[2]) == 1:
        assert edit == {"path": task.metadata["path"], "old_str": bug[2], "new_str": bug[1]}
    else:
        assert edit["old_str"].count("\n") >= 1 and bug[1] in edit["new_str"]
