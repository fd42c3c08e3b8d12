"""The gateway: train any OpenAI-client agent as a black box.

* ``gateway.py``: ``Gateway``, the state and the model-call logic (sessions, pause, sampling).
* ``sessions.py``: how requests map to token-exact trajectories (extend / fork / fresh branches).
* ``app.py``: the HTTP routes; ``streaming.py``: responses as server-sent events, live from the server.
* ``archive.py``: where finished sessions are kept (in memory, or durably in SQLite) and queried.
* ``client.py``: ``GatewayClient``, the admin client.
* ``serve.py``: ``start_gateway`` (a thread of this process) and ``agentgym gateway``;
  ``workers.py``: ``agentgym gateway --workers N``.
* ``agent_source.py``: ``AgentTrajectorySource``, the trainer's source of agent trajectories.
"""

from agentgym.gateway.client import GatewayClient
from agentgym.gateway.gateway import Gateway
from agentgym.gateway.serve import GatewayHandle, start_gateway

__all__ = ["Gateway", "GatewayClient", "GatewayHandle", "start_gateway"]
