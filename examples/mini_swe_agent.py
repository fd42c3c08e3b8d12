"""mini-swe-agent (PyPI ``mini-swe-agent``) as a black-box agent on agentgym's ``swe`` suite.

    pip install --no-deps mini-swe-agent        # its agent loop and templates; litellm is not used here
    python examples/mini_swe_agent.py --write-tasks swe_tasks.jsonl --n 64
    agentgym train --agent examples.mini_swe_agent:run data.train_files=swe_tasks.jsonl \\
        actor_rollout_ref.model.path=DIR     # a chat model that can follow mini-swe-agent's format

mini-swe-agent knows nothing about agentgym. For each task row (``extra_info.seed``: a seed of the ``swe``
suite) ``run`` makes the task, starts a workspace sandbox (``WorkspaceSandbox``) holding its files and runs
mini-swe-agent's own ``DefaultAgent`` with its ``mini_textbased.yaml`` templates (one fenced
``mswea_bash_command`` block per reply; ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` ends the run) and:

* a model that asks ``base_url`` with the ``openai`` client: through the gateway every call is recorded
  token for token, as for any agent;
* an environment whose ``execute`` runs the command in the sandbox (from ``/workspace``, a fresh shell each
  time as mini-swe-agent expects) instead of on the host.

Then the suite's verifier (visible and hidden tests, tests unchanged) scores the final workspace and ``run``
returns its reward, a float, which the gateway takes as the session's reward.

Try it against any OpenAI-compatible server:

    python examples/mini_swe_agent.py --base-url http://127.0.0.1:8000/v1 --seed 3
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

import yaml
from openai import OpenAI

from agentgym.envs.workspace.sandbox import WORKSPACE, WorkspaceLimits, WorkspaceSandbox
from agentgym.envs.workspace.suites.swe import SweSuite
from agentgym.envs.workspace.verifier import verify

STEP_LIMIT = 12


def mini_swe_agent_config() -> dict[str, Any]:
    """mini-swe-agent's own text-based config (``minisweagent/config/mini_textbased.yaml``)."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    text = resources.files("minisweagent").joinpath("config/mini_textbased.yaml").read_text()
    return yaml.safe_load(text)


class GatewayModel:
    """mini-swe-agent's ``Model`` protocol over the ``openai`` client (in place of its litellm models)."""

    def __init__(self, base_url: str, api_key: str, model: str, config: dict[str, Any]) -> None:
        from minisweagent.models.utils.actions_text import format_observation_messages, parse_regex_actions

        self._parse, self._observe = parse_regex_actions, format_observation_messages
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=5, timeout=600)
        self.model = model
        self.config = config
        self.action_regex = config.get("action_regex", r"```mswea_bash_command\s*\n(.*?)\n```")

    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        sent = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
        response = self.client.chat.completions.create(model=self.model, messages=sent)
        choice = response.choices[0]
        content = choice.message.content or ""
        actions = self._parse(
            content,
            action_regex=self.action_regex,
            format_error_template=self.config["format_error_template"],
            template_kwargs={"finish_reason": choice.finish_reason},
        )  # raises FormatError: the agent shows the model its format error
        return {"role": "assistant", "content": content, "extra": {"actions": actions, "cost": 0.0}}

    def format_message(self, **kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    def format_observation_messages(
        self, message: dict[str, Any], outputs: list[dict[str, Any]], template_vars: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        return self._observe(
            outputs, observation_template=self.config["observation_template"], template_vars=template_vars
        )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {"model_name": self.model, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"model": {"model_name": self.model}}}}


def sandbox_environment(sandbox: WorkspaceSandbox, timeout_s: float):
    """mini-swe-agent's ``LocalEnvironment`` with ``execute`` run in the workspace sandbox."""
    from minisweagent.environments.local import LocalEnvironment

    class SandboxEnvironment(LocalEnvironment):
        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
            result = sandbox.run(action.get("command", ""), timeout_s=timeout or timeout_s, cwd=WORKSPACE)
            output = {
                "output": result.output,
                "returncode": -1 if result.exit_code is None else result.exit_code,
                "exception_info": f"the command timed out after {timeout or timeout_s:g} s" if result.timed_out else "",
            }
            self._check_finished(output)  # raises Submitted on COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
            return output

        def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
            import platform

            return {**platform.uname()._asdict(), "cwd": WORKSPACE, **kwargs}

    return SandboxEnvironment(cwd=WORKSPACE, timeout=int(timeout_s))


def run(base_url: str, api_key: str, task: dict, model: str = "policy", step_limit: int = STEP_LIMIT) -> float:
    """Run mini-swe-agent on ``swe`` task ``task["extra_info"]["seed"]``; returns the verifier's reward."""
    from minisweagent.agents.default import DefaultAgent

    extra = task.get("extra_info") or {}
    workspace_task = SweSuite(**(extra.get("suite_kwargs") or {}))(int(extra.get("seed", task.get("seed", 0))))
    config = mini_swe_agent_config()
    limits = WorkspaceLimits()
    sandbox = WorkspaceSandbox(limits, workspace_task.files)
    try:
        agent = DefaultAgent(
            GatewayModel(base_url, api_key, model, config["model"]),
            sandbox_environment(sandbox, limits.timeout_s),
            **{**config["agent"], "step_limit": step_limit, "cost_limit": 0.0},
        )
        result = agent.run(workspace_task.instruction)
        archive = sandbox.archive()
    finally:
        sandbox.close()
    report = verify(workspace_task, archive, result.get("submission"), limits)
    return float(report.reward)


def task_rows(n: int, start: int = 0, **suite_kwargs: Any) -> list[dict[str, Any]]:
    """veRL-format rows for ``data.train_files``: the instruction as the prompt, the seed in ``extra_info``."""
    suite = SweSuite(**suite_kwargs)
    return [
        {
            "data_source": "agentgym/swe",
            "prompt": [{"role": "user", "content": suite(seed).instruction}],
            "reward_model": {"ground_truth": ""},
            "extra_info": {"seed": seed, "suite_kwargs": suite_kwargs},
        }
        for seed in range(start, start + n)
    ]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="mini-swe-agent on the swe suite")
    parser.add_argument("--write-tasks", metavar="FILE", help="write --n task rows (JSONL) and exit")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="the task to run (or the first row's seed)")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    if args.write_tasks:
        with open(args.write_tasks, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in task_rows(args.n, args.seed))
        print(f"wrote {args.n} swe task rows to {args.write_tasks}")
    else:
        print("reward:", run(args.base_url, args.api_key, {"extra_info": {"seed": args.seed}}, model=args.model))
