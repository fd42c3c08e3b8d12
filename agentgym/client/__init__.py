"""How everything above the policy servers talks to them: rollout, gateway and trainer alike.

* ``policy.py``: ``PolicyClient`` (token-level ``generate``, routing, retries, weight versions)
  and ``PolicyServerError``; ``pools.py``: ``HTTPPools`` for httpx clients (``ssl_context``: ``tls.py``).
* ``http11.py``: the lean HTTP/1.1 keep-alive transport ``PolicyClient`` uses for ``http://``.
* ``weights.py``: the weight adapters that make a running server load new weights.
* ``health.py``: ``wait_healthy``, the one ``/health`` polling loop.

Nothing here imports the server, the gateway or the trainer.
"""

from agentgym.client.policy import BACKENDS, HTTPPools, PolicyClient, PolicyServerError, ssl_context

__all__ = ["BACKENDS", "HTTPPools", "PolicyClient", "PolicyServerError", "ssl_context"]
