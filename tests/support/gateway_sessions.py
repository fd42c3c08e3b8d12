"""A gateway session as a test drives it: open one with the admin key, talk to it with the ``openai``
client, finish it and read back its trajectories (tests/gateway/)."""

from __future__ import annotations

import httpx
import openai

from agentgym.types import Trajectory


def admin(gw) -> dict[str, str]:
    """The admin key's header (a gateway always has a key: start_gateway makes one)."""
    return {"Authorization": f"Bearer {gw.admin_key}"}


def new_session(gw, **body) -> dict:
    """``POST /sessions``: the session's id, base URLs and key."""
    r = httpx.post(gw.url + "/sessions", json=body, headers=admin(gw))
    assert r.status_code == 200, r.text
    return r.json()


def client_for(info: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)


def session(gw, **body) -> tuple[dict, openai.OpenAI]:
    """A new session and an ``openai`` client on it."""
    info = new_session(gw, **body)
    return info, client_for(info)


def finish(gw, info: dict, **body) -> list[Trajectory]:
    """``POST /sessions/<id>/finish``: the session's trajectories."""
    r = httpx.post(f"{gw.url}/sessions/{info['id']}/finish", json=body, headers=admin(gw))
    assert r.status_code == 200, r.text
    return [Trajectory.from_dict(t) for t in r.json()["trajectories"]]
