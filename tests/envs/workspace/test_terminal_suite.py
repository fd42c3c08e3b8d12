from __future__ import annotations

import pytest

from agentgym.envs.workspace.expert_calls import submit
from agentgym.envs.workspace.suites.terminal import KINDS, TerminalSuite
from tests.support.workspace_harness import check_results, play

NEEDS_SANDBOX = False  # played in a plain temporary directory (tests/support/workspace_harness.py)


def test_same_seed_same_task_and_seeds_differ():
    suite = TerminalSuite()
    assert suite(7) == suite(7)
    tasks = [suite(s) for s in range(40)]
    assert len({(t.instruction, tuple(sorted(t.files.items()))) for t in tasks}) == 40
    assert [t.metadata["kind"] for t in tasks[:7]] == list(KINDS)  # kinds in turn: a held-out range is balanced
    assert suite(1_000_000).task_id == f"terminal/{suite(1_000_000).metadata['kind']}/1000000"


@pytest.mark.parametrize("kind", KINDS)
def test_expert_solves_and_nothing_done_fails(kind, tmp_path):
    suite = TerminalSuite(kinds=[kind])
    for seed in range(12):
        task = suite(seed)
        assert task.metadata["kind"] == kind and len(task.expert) == 2
        assert task.expert[0]["name"] == "bash" and task.expert[-1]["name"] == "submit"
        played = play(task, tmp_path / f"expert{seed}")
        assert all(check_results(task, played)), (task.instruction, played.outputs, task.checks)
        if "answer" in task.expert[-1]["arguments"]:  # the command prints exactly what is submitted
            assert played.outputs[0].strip() == task.expert[-1]["arguments"]["answer"]
        idle = play(task, tmp_path / f"idle{seed}", calls=[submit("nothing")])
        assert not all(check_results(task, idle)), task.instruction


def test_instructions_are_short():
    suite = TerminalSuite()
    assert max(len(suite(s).instruction) for s in range(200)) < 90


def test_unknown_kind_names_the_kinds():
    with pytest.raises(ValueError, match="count_lines"):
        TerminalSuite(kinds=["count_words"])


def test_flat_trees_keep_every_path_one_directory_deep(tmp_path):
    suite = TerminalSuite(nested=False)
    for seed in range(30):
        task = suite(seed)
        assert all(p.count("/") == 1 for p in task.files), task.files
        assert all(check_results(task, play(task, tmp_path / str(seed))))
    assert any(p.count("/") == 2 for s in range(30) for p in TerminalSuite()(s).files)


def test_one_word_names_are_shorter_and_still_solved(tmp_path):
    short, long = TerminalSuite(nested=False, name_words=1), TerminalSuite(nested=False)
    for seed in range(14):
        task = short(seed)
        stems = [p.rpartition("/")[2].partition(".")[0] for p in task.files]
        assert all("_" not in s for s in stems if not s.endswith(("_old", "_final", "_backup", "_v2"))), task.files
        assert all(check_results(task, play(task, tmp_path / str(seed))))
        assert task.metadata["kind"] == long(seed).metadata["kind"]  # the same chore, fewer characters to copy
    mean = [sum(len(s(x).instruction) for x in range(70)) / 70 for s in (short, long)]
    assert mean[0] < mean[1] - 4, mean
    with pytest.raises(ValueError, match="name_words"):
        TerminalSuite(name_words=3)
