"""The policy server: what samples tokens for everyone else.

* The embedded server: ``engine.py`` (continuous batching over a KV cache), ``app.py`` (FastAPI
  routes), ``streaming.py`` (server-sent events), ``openai_types.py`` (request/response models),
  ``errors.py`` (OpenAI-shaped errors, the one door for a JSON body), ``limits.py`` (request
  bounds, the admin key), ``tool_calls.py`` and ``token_pieces.py`` (shared with the gateway,
  which speaks the same API). ``http_timeouts.py``: uvicorn connections that send or read too
  slowly are closed (the gateway's too).
* ``handles.py``: ``PolicyServerHandle`` and its kinds (in this process, or a child process).
* ``launch.py``: ``start_embedded_server`` / ``start_policy_server`` and ``agentgym serve``.
* ``launchers.py``: vLLM and SGLang command lines and start-up; ``vllm_extension/`` holds the
  module loaded inside vLLM's workers to take pushed weights (standard library, torch and vLLM
  only: it runs in vLLM's environment).

Talking to a server (generation, weight pushes) is ``agentgym.client``'s job. Nothing heavy is
imported here; the names below load on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "PolicyServerHandle": "agentgym.server.handles",
    "start_embedded_server": "agentgym.server.launch",
    "start_policy_server": "agentgym.server.launch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym.server' has no attribute {name!r}")
