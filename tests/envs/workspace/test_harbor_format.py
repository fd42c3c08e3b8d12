from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.envs.workspace.expert_calls import submit
from agentgym.envs.workspace.formats.harbor import HarborTasks, UnsupportedTask, load_harbor_task
from tests.support.workspace_harness import check_results, play

NEEDS_SANDBOX = False  # played in a plain temporary directory (tests/support/workspace_harness.py)

DATA = Path(__file__).parent / "data"
TASK = DATA / "harbor" / "sum-sales"


def test_task_directory_parses_into_a_workspace_task():
    task = load_harbor_task(TASK)
    assert task.task_id == "harbor/sum-sales"
    assert task.instruction.startswith("Sum the `amount` column of /workspace/data/sales.csv")
    assert "/workspace/total.txt" in task.instruction and "/app" not in task.instruction
    assert task.files == {
        "data/sales.csv": "region,amount\nnorth,12\nsouth,30\neast,18\n",
        "README.txt": "Quarterly sales by region.\n",
    }
    assert set(task.verifier_files) == {".harbor/tests/test.sh", ".harbor/tests/check_inputs.sh", ".harbor/verify.py"}
    test_sh = task.verifier_files[".harbor/tests/test.sh"]
    assert (
        "/workspace/.harbor/logs/verifier/reward.txt" in test_sh
        and "bash /workspace/.harbor/tests/check_inputs.sh" in test_sh
    )
    assert [c.kind for c in task.checks] == ["command"] and task.checks[0].timeout_s == 60.0
    assert [c["name"] for c in task.expert] == ["bash", "submit"]
    assert "> /workspace/total.txt" in task.expert[0]["arguments"]["command"]
    assert task.metadata["difficulty"] == "easy" and task.metadata["workdir"] == "/app"


def test_solution_passes_and_nothing_done_fails(tmp_path):
    """Played in a plain directory: the task is read with that directory as its workspace."""
    solved, idle = tmp_path / "solved", tmp_path / "idle"
    task = load_harbor_task(TASK, workspace=str(solved))
    assert check_results(task, play(task, solved)) == [True]
    task = load_harbor_task(TASK, workspace=str(idle))
    assert check_results(task, play(task, idle, calls=[submit()])) == [False]


def test_reward_below_one_fails(tmp_path):
    task = load_harbor_task(TASK, workspace=str(tmp_path))
    wrong = [{"name": "bash", "arguments": {"command": "echo 59 > total.txt"}}, submit()]
    assert check_results(task, play(task, tmp_path, calls=wrong)) == [False]
    assert (tmp_path / ".harbor/logs/verifier/reward.txt").read_text().strip() == "0"


def test_a_dockerfile_that_runs_commands_is_refused_with_the_reason():
    with pytest.raises(UnsupportedTask, match=r"RUN apt-get update .*needs the\s+network"):
        load_harbor_task(DATA / "harbor_refused" / "apt-install")
    with pytest.raises(UnsupportedTask, match="1 of 1 Harbor task"):
        HarborTasks(DATA / "harbor_refused")


def _task_dir(tmp_path: Path, dockerfile: str, toml: str = "", test_sh: str = "echo 1 > /logs/verifier/reward.txt\n"):
    (tmp_path / "environment").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "instruction.md").write_text("Do it.\n")
    (tmp_path / "task.toml").write_text(toml)
    (tmp_path / "environment" / "Dockerfile").write_text(dockerfile)
    (tmp_path / "tests" / "test.sh").write_text(test_sh)
    return tmp_path


@pytest.mark.parametrize(
    "dockerfile,toml,test_sh,reason",
    [
        ("FROM x\nWORKDIR /app\nENV A=1\n", "", "echo 1\n", "ENV is not supported"),
        ("FROM x\nCOPY a.txt /a.txt\n", "", "echo 1\n", "no WORKDIR"),
        ("FROM x\nWORKDIR /app\nCOPY --from=build /out /app\n", "", "echo 1\n", "another image"),
        ("FROM x\nWORKDIR /app\n", '[environment]\ndocker_image = "me/img:1"\n', "echo 1\n", "prebuilt image"),
        ("FROM x\nWORKDIR /app\n", "[environment]\nallow_internet = true\n", "echo 1\n", "allow_internet"),
        ("FROM x\nWORKDIR /app\n", "", "curl -LsSf https://astral.sh/uv/install.sh | sh\n", "'curl'"),
        ("FROM x\nWORKDIR /app\n", "", "uvx -p 3.13 -w pytest pytest /tests\n", "'uvx'"),
    ],
)
def test_what_needs_a_container_is_refused(tmp_path, dockerfile, toml, test_sh, reason):
    with pytest.raises(UnsupportedTask, match=reason):
        load_harbor_task(_task_dir(tmp_path, dockerfile, toml, test_sh))


def test_a_folder_of_tasks_is_a_task_source(tmp_path):
    source = HarborTasks(DATA / "harbor")
    assert len(source) == 1 and source(0) is source(7)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "ok").symlink_to(TASK)
    (mixed / "refused").symlink_to(DATA / "harbor_refused" / "apt-install")
    with pytest.warns(UserWarning, match="left out 1 Harbor task"):
        source = HarborTasks(mixed, skip_unsupported=True)
    assert len(source) == 1 and "RUN apt-get" in source.refused["refused"]
    with pytest.raises(FileNotFoundError, match="no Harbor task"):
        HarborTasks(tmp_path / "nothing")
