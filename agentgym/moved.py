"""Modules that moved when the policy server, the client and the gateway became parts of their own, and
when the trainer kept only the RL loop (stages, compat and rewards got rooms of their own).

Importing an old name fails with an error that names the new place (``agentgym/__init__.py``
installs ``MovedModuleFinder`` behind Python's own finders, so it only answers for modules
that no longer exist).
"""

from __future__ import annotations

import sys
from typing import Any

MOVED = {
    "agentgym.server.client": "agentgym.client (PolicyClient, PolicyServerError, HTTPPools)",
    "agentgym.server.http11": "agentgym.client.http11",
    "agentgym.server.weights": "agentgym.model.weights (weight files) and agentgym.client.weights (adapters)",
    "agentgym.server.gateway": "agentgym.gateway (start_gateway, GatewayClient, Gateway)",
    "agentgym.server.sessions": "agentgym.gateway.sessions",
    "agentgym.server.gateway_workers": "agentgym.gateway.workers",
    "agentgym.rollout.agent_source": "agentgym.gateway.agent_source",
    "agentgym.envs.interaction_env": "agentgym.interactions.env",
    "agentgym.trainer.main": "agentgym.trainer.run (train, describe) and agentgym.stages.train_command (train_command)",
    "agentgym.trainer.warm_start": "agentgym.stages.warm_start",
    "agentgym.trainer.held_out": "agentgym.stages.held_out",
    "agentgym.trainer.stage_cache": "agentgym.stages.stage_cache (model_key: agentgym.model.identity)",
    "agentgym.trainer.sft": "agentgym.stages.sft",
    "agentgym.trainer.sft_data": "agentgym.stages.sft_data",
    "agentgym.trainer.offline": "agentgym.stages.offline",
    "agentgym.trainer.plots": "agentgym.plots",
    "agentgym.trainer.lora": "agentgym.model.lora",
    "agentgym.trainer.compat": "agentgym.compat (the `agentgym config` command: agentgym.stages.config_command)",
    "agentgym.trainer.rewards": "agentgym.rewards",
    "agentgym.trainer.sources": "agentgym.rollout.sources",
    "agentgym.trainer.multi_env_source": "agentgym.rollout.multi_env_source",
    "agentgym.trainer.env_groups": "agentgym.rollout.env_groups",
    "agentgym.trainer.data_prep": "agentgym.rollout.data_prep",
    "agentgym.trainer.agent_flows": "agentgym.gateway.agent_flows",
    "agentgym.trainer.engine_args": "agentgym.compat.engine_args",
    "agentgym.trainer.config_notes": "agentgym.compat.config_notes",
    "agentgym.trainer.loggers": "agentgym.tracking",
    "agentgym.trainer.preflight": "agentgym.preflight",
}


class MovedModuleFinder:
    """A ``sys.meta_path`` finder that raises ``ModuleNotFoundError`` naming a moved module's new place."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} moved: import it from {MOVED[fullname]}", name=fullname)
        return None


def install() -> None:
    if not any(f is MovedModuleFinder for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder)
