"""``openenv``: a text env that steps any running OpenEnv server.

    agentgym.make("openenv", base_url="http://127.0.0.1:8010")
    agentgym train --env openenv +env.kwargs.base_url=http://127.0.0.1:8010 trainer.total_training_steps=2

One WebSocket session (OpenEnv's ``/ws``) per env instance, kept across episodes: ``reset``
sends ``{"type": "reset", "data": {"seed": ..., **reset_kwargs}}``, ``step`` sends the action.
No OpenEnv package is needed: the protocol is JSON over a WebSocket.

Observations become chat messages:

* an agentgym server (``agentgym env-serve``) sends ``messages`` and ``info``: used as they are;
* any other OpenEnv env: ``observation_field`` (default: the observation's only text field,
  else the whole observation as JSON) becomes one user message per step.

The reply becomes the action: ``{"message": reply}`` for an agentgym server; otherwise
``{action_field: text}`` where ``action_field`` defaults to the one required property of the
server's action schema (``GET /schema``); ``action_format="json"`` sends the reply parsed as
a JSON object instead (for actions with several fields). ``reward`` is the step's reward; when
``done``, the outcome reward is ``info["outcome_reward"]`` if the server reports one, else the
last step's reward (``outcome="sum"``: the episode's total).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.types import Action, Message


class OpenEnvError(RuntimeError):
    """The OpenEnv server answered with an error or went away."""


class OpenEnvClientEnv(TextEnv):
    """Any running OpenEnv server as a text env (``base_url=``)."""

    def __init__(
        self,
        base_url: str,
        action_field: str | None = None,
        observation_field: str | None = None,
        action_format: str = "text",
        outcome: str = "last",
        system_prompt: str | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        max_turns: int | None = None,
        timeout_s: float = 300.0,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if action_format not in ("text", "json"):
            raise ValueError(f"action_format must be 'text' or 'json', got {action_format!r}")
        if outcome not in ("last", "sum"):
            raise ValueError(f"outcome must be 'last' or 'sum', got {outcome!r}")
        self.base_url = base_url.rstrip("/")
        self.action_format = action_format
        self.outcome = outcome
        self.system_prompt = system_prompt
        self.reset_kwargs = dict(reset_kwargs or {})
        self.timeout_s = timeout_s
        self.observation_field = observation_field
        self.max_turns = max_turns
        self._ws: Any = None
        self._total = 0.0
        self.last_observation: dict[str, Any] = {}
        schema = self._get("/schema")
        props = (schema.get("action") or {}).get("properties") or {}
        self.agentgym_server = set(props) == {"message"} and "messages" in (
            (schema.get("observation") or {}).get("properties") or {}
        )
        required = (schema.get("action") or {}).get("required") or list(props)
        self.action_field = action_field or (required[0] if len(required) == 1 else None)
        if action_format == "text" and self.action_field is None:
            raise ValueError(
                f"{self.base_url}'s actions have fields {sorted(props)}: name the one the reply goes "
                "in (action_field=...) or send replies as JSON objects (action_format='json')"
            )
        state = {}
        if self.agentgym_server:
            state = self._get("/state")
            agents = state.get("agents")
            if agents:
                self.agents = list(agents)
            self.max_turns = max_turns if max_turns is not None else state.get("max_turns")
        self._num_tasks = state.get("num_tasks")

    def num_tasks(self) -> int | None:
        return self._num_tasks

    # ---- the protocol --------------------------------------------------------------------
    def _get(self, path: str) -> dict[str, Any]:
        import httpx

        try:
            response = httpx.get(self.base_url + path, timeout=30.0)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise OpenEnvError(f"GET {self.base_url}{path} failed: {exc}. Is the OpenEnv server running?") from exc
        return response.json()

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.sync.client import connect

        if self._ws is None:
            url = ("ws" + self.base_url[4:] if self.base_url.startswith("http") else self.base_url) + "/ws"
            try:
                self._ws = connect(url, max_size=None, open_timeout=30)
            except Exception as exc:  # noqa: BLE001
                raise OpenEnvError(f"could not open {url}: {type(exc).__name__}: {exc}") from exc
        try:
            self._ws.send(json.dumps(message))
            reply = json.loads(self._ws.recv(timeout=self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - a dead session is dropped; the next reset opens another
            self.close()
            raise OpenEnvError(f"OpenEnv session at {self.base_url} failed: {type(exc).__name__}: {exc}") from exc
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise OpenEnvError(f"OpenEnv server {self.base_url}: {data.get('message', data)}")
        return reply.get("data") or {}

    def _messages(self, observation: dict[str, Any], first: bool) -> tuple[list[Message], dict[str, Any]]:
        if self.agentgym_server:
            return list(observation.get("messages") or []), dict(observation.get("info") or {})
        field = self.observation_field
        if field is None:
            texts = [k for k, v in observation.items() if isinstance(v, str)]
            field = texts[0] if len(texts) == 1 else None
        text = (
            str(observation.get(field, ""))
            if field
            else json.dumps({k: v for k, v in observation.items() if v is not None}, default=str)
        )
        messages: list[Message] = []
        if first and self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": text})
        return messages, {}

    def _action(self, action: Action) -> dict[str, Any]:
        if self.agentgym_server:
            return {"message": action}
        text = reply_text(action)
        if self.action_format == "json":
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):  # RecursionError: nested too deeply
                value = None
            if not isinstance(value, dict):
                raise ValueError(f"the reply is not a JSON object: {text[:200]!r}")
            return value
        return {self.action_field: text}

    # ---- TextEnv -------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        data: dict[str, Any] = {**self.reset_kwargs}
        if seed is not None:
            data["seed"] = seed
        if options is not None and self.agentgym_server:
            data["options"] = options
        result = self._request({"type": "reset", "data": data})
        self._total = 0.0
        self.last_observation = result.get("observation") or {}
        return self._messages(self.last_observation, first=True)

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        try:
            payload = self._action(action)
        except ValueError as exc:  # a reply that is not an action: say so, as the env's next message
            return [{"role": "user", "content": f"Invalid action: {exc}"}], 0.0, False, False, {"invalid_action": True}
        result = self._request({"type": "step", "data": payload})
        observation = result.get("observation") or {}
        self.last_observation = observation
        reward = float(result.get("reward") or 0.0)
        self._total += reward
        done = bool(result.get("done"))
        messages, info = self._messages(observation, first=False)
        truncated = bool(observation.get("truncated")) if self.agentgym_server else False
        if done and "outcome_reward" not in info and not self.agents_protocol:
            info["outcome_reward"] = self._total if self.outcome == "sum" else reward
        return messages, reward, done and not truncated, truncated, info

    @property
    def agents_protocol(self) -> bool:
        return bool(getattr(self, "agents", None))

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:  # a session that is already gone needs no closing
            with contextlib.suppress(Exception):
                ws.send(json.dumps({"type": "close"}))
            with contextlib.suppress(Exception):
                ws.close()
