"""verifiers environments as text envs: ``vf/<module>`` for any module with ``load_environment``.

    agentgym.make("vf/my_env_module", num_examples=100)   # kwargs go to load_environment

The env is ``verifiers.load_environment(module, **kwargs)`` (verifiers' classic API, 0.1.9 to
0.2.x: ``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``, ...), and each episode is that env's own
``run_rollout`` on one dataset row: its stop conditions, ``env_response``, tool calls and rubric
all run as verifiers wrote them. agentgym only stands in for the model: the rollout's model
client is a bridge whose ``get_response`` hands the prompt to ``reset``/``step`` and waits for
the policy's reply. So

* ``reset`` starts the rollout and returns its first prompt (system prompt and question);
  ``info["tools"]`` holds the env's tool definitions as OpenAI schemas (the runner's tool path
  turns the model's Hermes ``<tool_call>`` blocks into ``tool_calls``, which the bridge gives
  verifiers as its ``ToolCall``s);
* ``step`` replies for the model; the new messages are what the env appended before asking
  the model again (its ``env_response``: feedback, tool results);
* when the rollout ends, the rubric has scored it: ``info["outcome_reward"]`` is verifiers'
  ``reward`` (the weighted sum of its reward functions) and ``info["metrics"]`` its per-function
  scores. Turn rewards are 0.

The rows are the env's ``dataset`` (``split="eval"``: its ``eval_dataset``); ``num_tasks()`` is its
length and ``options={"index": i}`` picks a row. The rollout runs on a background event loop
shared by the envs of a process, so ``reset``/``step`` work from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import json
import os
import queue
import threading
import time
from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.registry import EnvFamily, EnvSpec
from agentgym.types import Action, Message


class _Loop:
    """One event loop on a daemon thread for every verifiers env of this process (made again after fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="agentgym-verifiers", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_LOOP = _Loop()


def to_openai(message: Any) -> Message:
    """A verifiers message (pydantic) as an OpenAI chat dict."""
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    out: dict[str, Any] = {"role": data["role"], "content": data.get("content")}
    if isinstance(out["content"], list):  # content parts: keep the text
        out["content"] = "".join(p.get("text", "") for p in out["content"] if isinstance(p, dict))
    if data.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in data["tool_calls"]
        ]
    if data.get("tool_call_id"):
        out["tool_call_id"] = data["tool_call_id"]
    return out  # type: ignore[return-value]


def tool_schema(tool: Any) -> dict[str, Any]:
    """A verifiers ``Tool`` (name, description, parameters) as an OpenAI tool schema."""
    data = tool.model_dump(exclude_none=True) if hasattr(tool, "model_dump") else dict(tool)
    return {
        "type": "function",
        "function": {
            "name": data["name"],
            "description": data.get("description", ""),
            "parameters": data.get("parameters") or {"type": "object"},
        },
    }


def _bridge_client_class() -> type:
    import verifiers as vf
    from verifiers.types import Response, ResponseMessage, ToolCall

    class BridgeClient(vf.Client):
        """A verifiers model client that asks agentgym's ``step`` instead of a model."""

        def __init__(self, env: VerifiersEnv) -> None:
            super().__init__(None)
            self.env = env

        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(
            self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any
        ) -> Any:
            raise NotImplementedError  # get_response is overridden

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

        async def get_response(
            self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any
        ) -> Any:
            loop = asyncio.get_running_loop()
            reply: asyncio.Future = loop.create_future()
            self.env._turns.put(("prompt", (list(prompt), list(tools or [])), (loop, reply)))
            action = await reply
            calls = [
                ToolCall(
                    id=c.get("id") or f"call_{i}",
                    name=c["function"]["name"],
                    arguments=c["function"]["arguments"]
                    if isinstance(c["function"]["arguments"], str)
                    else json.dumps(c["function"]["arguments"]),
                )
                for i, c in enumerate(action.get("tool_calls") or [])
            ]
            message = ResponseMessage(
                content=action.get("content") or "",
                tool_calls=calls or None,
                finish_reason="tool_calls" if calls else "stop",
                is_truncated=False,
            )
            return Response(id=f"agentgym-{time.time_ns()}", created=int(time.time()), model=model, message=message)

    return BridgeClient


class VerifiersEnv(TextEnv):
    """A verifiers environment: its rollout loop, env responses, tools and rubric, the policy as its model."""

    def __init__(
        self,
        module: str,
        split: str = "train",
        timeout_s: float | None = 600.0,
        render_mode: str | None = None,
        **env_args: Any,
    ) -> None:
        super().__init__(render_mode=render_mode)
        import verifiers as vf

        self.module = module
        self.timeout_s = timeout_s
        self.vf_env = vf.load_environment(module, **env_args)
        dataset = self.vf_env.get_eval_dataset() if split == "eval" else self.vf_env.get_dataset()
        self.rows = [dict(row) for row in dataset]
        self.max_turns = getattr(self.vf_env, "max_turns", None) if getattr(self.vf_env, "max_turns", -1) > 0 else None
        self._client = _bridge_client_class()(self)
        self._turns: queue.Queue = queue.Queue()
        self._rollout: concurrent.futures.Future | None = None
        self._reply: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._prompt_len = 0
        self.index = 0
        self.last_output: dict[str, Any] | None = None

    def num_tasks(self) -> int:
        return len(self.rows)

    # ---- the bridge ----------------------------------------------------------------------
    def _start(self, row: dict[str, Any]) -> None:
        async def rollout() -> Any:
            try:
                output = await self.vf_env.run_rollout(row, self._client, "agentgym", {})
                self._turns.put(("done", output, None))
            except BaseException as exc:
                self._turns.put(("error", exc, None))
                raise

        self._rollout = asyncio.run_coroutine_threadsafe(rollout(), _LOOP.get())

    def _next(self) -> tuple[str, Any, Any]:
        try:
            return self._turns.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"the verifiers rollout did not ask for a reply or finish within {self.timeout_s}s"
            ) from None

    def _stop(self) -> None:
        if self._rollout is not None and not self._rollout.done():
            self._rollout.cancel()
        self._rollout = None
        self._reply = None
        self._turns = queue.Queue()

    # ---- TextEnv -------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        self._stop()
        if options and options.get("index") is not None:
            self.index = int(options["index"]) % len(self.rows)
        elif seed is not None:
            self.index = seed % len(self.rows)
        else:
            self.index = int(self.np_random.integers(len(self.rows)))
        self.last_output = None
        self._start(self.rows[self.index])
        kind, value, reply = self._next()
        if kind != "prompt":
            raise RuntimeError(f"verifiers env {self.module} ended before asking the model: {value!r}")
        prompt, tools = value
        self._reply, self._prompt_len = reply, len(prompt)
        info: dict[str, Any] = {"index": self.index, "data_source": f"vf/{self.module}"}
        if tools:
            info["tools"] = [tool_schema(t) for t in tools]
        return [to_openai(m) for m in prompt], info

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self._reply is None:
            raise RuntimeError("call reset() before step(): the rollout has ended")
        message = dict(action) if isinstance(action, dict) else {"role": "assistant", "content": reply_text(action)}
        loop, future = self._reply
        self._reply = None
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(message))
        kind, value, reply = self._next()
        info: dict[str, Any] = {"index": self.index, "data_source": f"vf/{self.module}"}
        if kind == "prompt":
            prompt, _tools = value
            new = prompt[self._prompt_len + 1 :]  # after the previous prompt and the model's reply
            self._reply, self._prompt_len = reply, len(prompt)
            return [to_openai(m) for m in new], 0.0, False, False, info
        if kind == "error":
            raise value
        output = dict(value)
        self.last_output = output
        self._rollout = None
        reward = float(output.get("reward") or 0.0)
        metrics = {k: float(v) for k, v in (output.get("metrics") or {}).items() if isinstance(v, (int, float))}
        threshold = float(getattr(self.vf_env, "pass_threshold", 0.5))
        info.update(
            outcome_reward=reward,
            success=reward >= threshold,
            metrics=metrics,
            stop_condition=output.get("stop_condition"),
        )
        if output.get("error"):
            info["error"] = str(output["error"])
        truncated = bool(output.get("is_truncated")) and output.get("stop_condition") != "no_tools_called"
        return [], 0.0, not truncated, truncated, info

    def close(self) -> None:
        self._stop()


class VerifiersFamily(EnvFamily):
    prefix = "vf"
    member_label = "module"
    description = "verifiers environments (a module's load_environment), the rubric as reward"
    requires = "verifiers"
    extra = "verifiers"
    open_ended = True  # any importable module with load_environment

    def members(self) -> list[str]:
        """Installed distributions that depend on verifiers: their top-level modules."""
        found = set()
        for dist in importlib.metadata.distributions():
            name = (dist.metadata.get("Name") or "").lower()
            if name in ("verifiers", "agentgym"):
                continue
            if any(r.split(";")[0].strip().lower().startswith("verifiers") for r in dist.requires or ()):
                top = (dist.read_text("top_level.txt") or "").split()
                found.update(top or [name.replace("-", "_")])
        return sorted(found)

    def member_spec(self, member: str) -> EnvSpec:
        return EnvSpec(
            name=f"vf/{member}",
            entry_point=VerifiersEnv,
            kwargs={"module": member},
            description=f"verifiers environment {member}",
        )


FAMILY = VerifiersFamily()
