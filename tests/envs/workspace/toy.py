"""A toy task source for the workspace env's tests (not a suite): seed -> a small file-fixing task.

Seed ``n`` asks the agent to make ``count.txt`` hold ``n`` and fix ``add.py`` (it subtracts); the
hidden test (a verifier file) imports ``add`` and checks it. The expert does it with the editor
tools and one bash call, then submits the answer ``n*2``.
"""

from __future__ import annotations

from agentgym.envs.workspace.task import Check, WorkspaceTask

HIDDEN_TEST = "from add import add\nassert add(2, 3) == 5, add(2, 3)\nprint('hidden test passed')\n"


def toy_task(seed: int) -> WorkspaceTask:
    return WorkspaceTask(
        task_id=f"toy-{seed}",
        instruction=(
            f"Fix add.py so that add(a, b) returns a + b, write {seed} into count.txt (no newline), "
            f"and submit the answer {seed} * 2."
        ),
        files={"add.py": "def add(a, b):\n    return a - b\n", "notes/readme.md": "toy task\n"},
        checks=(
            Check(kind="command", command="python3 hidden_test.py", timeout_s=10.0),
            Check(kind="file", path="count.txt", content=str(seed)),
            Check(kind="answer", answer=str(seed * 2)),
        ),
        verifier_files={"hidden_test.py": HIDDEN_TEST},
        expert=(
            {"name": "read_file", "arguments": {"path": "add.py"}},
            {"name": "str_replace", "arguments": {"path": "add.py", "old_str": "a - b", "new_str": "a + b"}},
            {"name": "bash", "arguments": {"command": f"printf %s {seed} > count.txt && cat count.txt"}},
            {"name": "submit", "arguments": {"answer": str(seed * 2)}},
        ),
        max_turns=6,
    )
