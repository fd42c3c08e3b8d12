"""Policy servers and the client everything else talks to them with.

* ``client.py``: ``PolicyClient`` (token-level ``generate``, routing, retries) and ``PolicyServerError``.
* ``launch.py``: ``start_embedded_server`` / ``start_policy_server`` -> a ``PolicyServerHandle``
  (``.url``, ``.backend``, ``.model``, ``.update_weights(path_or_state, version)``, ``.stop()``),
  and ``serve_command`` behind ``agentgym serve``.
* The embedded server: ``engine.py`` (continuous batching over a KV cache), ``app.py`` (FastAPI
  routes), ``openai_types.py`` (request/response models), ``tool_calls.py``, ``weights.py``.
* ``engines.py``: vLLM and SGLang command lines, start-up and weight-update adapters.
* ``gateway.py``: the OpenAI gateway for black-box agents.

Nothing heavy is imported here; the names below load on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "PolicyClient": "agentgym.server.client",
    "PolicyServerError": "agentgym.server.client",
    "PolicyServerHandle": "agentgym.server.launch",
    "start_embedded_server": "agentgym.server.launch",
    "start_policy_server": "agentgym.server.launch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym.server' has no attribute {name!r}")
