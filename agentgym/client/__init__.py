"""How everything above the policy servers talks to them: rollout, gateway and trainer alike.

* ``policy.py``: ``PolicyClient`` (token-level ``generate``, routing, retries, weight versions)
  and ``PolicyServerError``.
* ``http11.py``: the lean HTTP/1.1 keep-alive transport ``PolicyClient`` uses for ``http://``;
  ``httpx_pools.py``: ``HTTPPools`` and the httpx transport for ``https://``; ``tls.py``:
  ``ssl_context``, one TLS context for every httpx client.
* ``versions.py``: the weight version each server holds, recorded when a push succeeds.
* ``weights.py``: the weight adapters that make a running server load new weights.
* ``health.py``: ``wait_healthy``, the one ``/health`` polling loop.

Nothing here imports the server, the gateway or the trainer.
"""

from agentgym.client.httpx_pools import HTTPPools
from agentgym.client.policy import BACKENDS, PolicyClient, PolicyServerError
from agentgym.client.tls import ssl_context

__all__ = ["BACKENDS", "HTTPPools", "PolicyClient", "PolicyServerError", "ssl_context"]
