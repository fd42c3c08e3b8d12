"""Shared by the workspace tests: skip (saying why) where the sandbox cannot run here (modules that
need no sandbox set ``NEEDS_SANDBOX = False``)."""

from __future__ import annotations

import pytest

from agentgym.envs.workspace.sandbox import workspace_problem


@pytest.fixture(autouse=True)
def _needs_workspace_sandbox(request: pytest.FixtureRequest) -> None:
    if not getattr(request.module, "NEEDS_SANDBOX", True):
        return
    problem = workspace_problem()
    if problem is not None:
        pytest.skip(f"the workspace sandbox cannot run here: {problem}")
