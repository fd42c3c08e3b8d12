"""Modules that moved when the policy server, the client and the gateway became parts of their own.

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
