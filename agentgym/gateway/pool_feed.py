"""A gateway process feeding a named DataPool (Claw-R1's gateway options).

    agentgym gateway --server http://rollout-node:8000 --data-pool-name agentgym-pool \\
        --ray-address 10.0.0.1:6379 --ray-namespace agentgym --prompt-length 1024 --response-length 1024

``--data-pool-name`` joins the Ray cluster at ``--ray-address`` (namespace ``--ray-namespace``) and
finds the ``DataPool`` actor of that name (``agentgym.rollout.data_pool.create_pool_actor``; it
waits for it to appear). Every session finished through this gateway (``POST /sessions/<id>/finish``)
delivers its trajectories to that pool under the session's group id, before the caller gets the
answer, so a caller that sees the answer knows the pool has them; a group is complete once the pool's
``group_size`` sessions arrived. ``--prompt-length`` + ``--response-length`` bound a session's
context (the gateway's ``max_model_len``), as Claw-R1's do; what is too long for training is left
for the trainer to skip (``data.max_prompt_length`` / ``max_response_length``), never dropped here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentgym.types import Trajectory

_FINISH = re.compile(r"^/sessions/[^/]+/finish$")


class PoolFeed:
    """ASGI middleware over the gateway's app (see the module docstring)."""

    def __init__(self, app: Any, pool: Any) -> None:
        self.app = app
        self.pool = pool  # a DataPool actor handle
        self.delivered = 0
        self.finished: set[str] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or not _FINISH.match(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        held: list[dict[str, Any]] = []
        body = bytearray()

        async def hold(message: dict[str, Any]) -> None:
            held.append(message)
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b""))

        await self.app(scope, receive, hold)
        status = next((m["status"] for m in held if m["type"] == "http.response.start"), 500)
        sid = scope["path"].split("/")[2]
        if status == 200 and sid not in self.finished:  # a repeated finish answers again: deliver once
            answer = json.loads(bytes(body) or b"{}")
            await self.deliver(str(answer.get("group_id") or sid), answer.get("trajectories") or [])
            self.finished.add(sid)
        for message in held:
            await send(message)

    async def deliver(self, group_id: str, trajectories: list[dict[str, Any]]) -> None:
        """One finished session's trajectories to the pool (none when its agent never called the
        model: the session still counts towards its group)."""
        await self.pool.add.remote(group_id, [Trajectory.from_dict(t) for t in trajectories])
        self.delivered += 1


def pool_feed(name: str, namespace: str, address: str | None) -> Any:
    """The ``wrap`` for ``serve_gateway``: joins Ray and finds the named pool."""
    from agentgym.rollout.data_pool import connect_pool

    pool = connect_pool(name, namespace, address)
    return lambda app: PoolFeed(app, pool)
