"""The workspace suites as registered envs: ``WorkspaceEnv`` over a suite's task source.

* ``terminal`` (``TerminalEnv``): generated shell chores; ``terminal/<kind>`` one kind (``terminal/count_lines``);
* ``swe`` (``SweEnv``): generated bug-fix packages; ``swe/<kind>`` one bug kind (``swe/off_by_one``);
* ``harbor`` (``HarborEnv``): Harbor / Terminal-Bench task directories at ``path``;
* ``swebench`` (``SweBenchEnv``): SWE-bench-style instances from a JSON / JSONL file at ``path``.

Every other keyword is ``WorkspaceEnv``'s (``limits``, ``max_turns``, ``system_prompt``, ...), plus
``offer_tools``: ``False`` leaves the tool schemas out of ``info["tools"]`` (the chat template then renders none:
about 1,500 fewer prompt tokens with the tiny model's tokenizer) while calls written as Hermes ``<tool_call>`` text
still run, as Sokoban's ``offer_tools`` does; for a small model that learns the calls from demonstrations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.envs.workspace.env import WorkspaceEnv
from agentgym.envs.workspace.suites.swe import BUG_KINDS, SweSuite
from agentgym.envs.workspace.suites.terminal import KINDS, TerminalSuite
from agentgym.registry import EnvFamily, EnvSpec
from agentgym.types import Message


class SuiteEnv(WorkspaceEnv):
    """``WorkspaceEnv`` with ``offer_tools``."""

    def __init__(self, offer_tools: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.offer_tools = bool(offer_tools)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, info = super().reset(seed=seed, options=options)
        if not self.offer_tools:
            info.pop("tools", None)
        return messages, info


class TerminalEnv(SuiteEnv):
    """Shell chores over a generated file tree (find, count, grep, move, extract, fix a config); seeded."""

    def __init__(
        self,
        kinds: Sequence[str] | str | None = None,
        num_files: int = 6,
        nested: bool = True,
        name_words: int = 2,
        **kwargs: Any,
    ) -> None:
        """``kinds``: chore kinds drawn from (default all); ``num_files``: filler files in the tree; ``nested``:
        paths two directories deep (else one); ``name_words``: words in a file name's stem (2 or 1)."""
        super().__init__(tasks=TerminalSuite(kinds, num_files, nested, name_words=name_words), **kwargs)


class SweEnv(SuiteEnv):
    """Fix an injected bug in a small generated Python package so its visible and hidden tests pass; seeded."""

    def __init__(
        self,
        bug_kinds: Sequence[str] | str | None = None,
        modules: int = 2,
        functions_per_module: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(tasks=SweSuite(bug_kinds, modules, functions_per_module), **kwargs)


class HarborEnv(SuiteEnv):
    """Harbor / Terminal-Bench task directories, run without a container (needs path=: a task dir or a folder)."""

    def __init__(self, path: str | None = None, **kwargs: Any) -> None:
        from agentgym.envs.workspace.formats.harbor import HarborTasks

        self.source = HarborTasks(_required_path(path, "harbor", "a Harbor task directory or a folder of them"))
        super().__init__(tasks=self.source, **kwargs)

    def num_tasks(self) -> int | None:
        return len(self.source)


class SweBenchEnv(SuiteEnv):
    """SWE-bench-style instances with local repository snapshots (needs path=: a .json or .jsonl file)."""

    def __init__(self, path: str | None = None, **kwargs: Any) -> None:
        from agentgym.envs.workspace.formats.swebench import SweBenchTasks

        self.source = SweBenchTasks(_required_path(path, "swebench", "a .json/.jsonl file of instances"))
        super().__init__(tasks=self.source, **kwargs)

    def num_tasks(self) -> int | None:
        return len(self.source)


def _required_path(path: str | None, env: str, what: str) -> str:
    if not path:
        raise ValueError(f"the {env} env needs path=: {what} (e.g. env.kwargs.path=DIR)")
    return path


class TerminalFamily(EnvFamily):
    prefix = "terminal"
    member_label = "kind"
    description = "terminal chores of one kind (find, count_lines, count_files, grep, move, extract, fix_config)"

    def members(self) -> list[str]:
        return list(KINDS)

    def member_spec(self, member: str) -> EnvSpec:
        return EnvSpec(
            name=f"terminal/{member}",
            entry_point=TerminalEnv,
            kwargs={"kinds": [member]},
            description=f"terminal chores: {member}",
        )


class SweFamily(EnvFamily):
    prefix = "swe"
    member_label = "bug kind"
    description = "generated bug fixes of one kind (operator, off_by_one, constant, missing_case)"

    def members(self) -> list[str]:
        return list(BUG_KINDS)

    def member_spec(self, member: str) -> EnvSpec:
        return EnvSpec(
            name=f"swe/{member}", entry_point=SweEnv, kwargs={"bug_kinds": [member]}, description=f"swe: {member}"
        )


TERMINAL_FAMILY = TerminalFamily()
SWE_FAMILY = SweFamily()
