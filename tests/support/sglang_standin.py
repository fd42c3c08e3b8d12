"""A stand-in for SGLang's HTTP server that checks and answers requests field by field as SGLang
does, so agentgym's SGLang dialect (``PolicyClient(backend="sglang")``, ``SGLangWeights``) is
tested against what SGLang accepts and returns. No SGLang build runs on a CPU machine like
the one CI uses (see docs/deploy.md, "SGLang"), so this is where the adapter meets SGLang's API.

What it follows (SGLang's ``srt/entrypoints/http_server.py``, ``srt/managers/io_struct.py``
and ``srt/sampling/sampling_params.py``):

* ``POST /generate`` (``GenerateReqInput``): ``input_ids`` (or ``text``), ``sampling_params``,
  ``return_logprob``, ``stream``. ``sampling_params`` becomes ``SamplingParams(**params)``:
  an unknown key is an error, and ``verify`` rejects ``temperature < 0``, ``top_p`` outside
  (0, 1] and ``top_k`` other than -1 or >= 1 (temperature 0 means greedy). The answer:
  ``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
  "completion_tokens", "cached_tokens", "weight_version", "e2e_latency",
  "output_token_logprobs": [[logprob, token_id, None], ...]}}``; ``finish_reason`` is
  ``{"type": "stop", "matched": id}``, ``{"type": "length", "length": n}`` or
  ``{"type": "abort", "message": ...}``. Without ``no_stop_trim`` the matched stop token is
  trimmed from ``text`` and ``output_ids`` (the logprobs keep it). Errors are 400s shaped
  like SGLang's ``ErrorResponse``.
* ``GET /health``, ``/get_model_info`` (``model_path``, ``tokenizer_path``,
  ``is_generation``, ``preferred_sampling_params``, ``weight_version``),
  ``/get_weight_version``, ``/v1/models`` (the served model name, ``root``,
  ``max_model_len``); ``GET|POST /flush_cache``.
* Weights: ``POST /update_weights_from_disk`` (``UpdateWeightFromDiskReqInput``:
  ``model_path`` required and a directory holding ``config.json`` and ``*.safetensors``,
  as SGLang's loader needs; ``weight_version`` a string), ``/update_weights_from_tensor``,
  ``/init_weights_update_group``, ``/update_weights_from_distributed``,
  ``/update_weight_version`` (``new_version``). Each answers ``{"success", "message"}``
  (400 on failure). ``weight_version`` starts as ``"default"``, as in SGLang.
* ``POST /pause_generation`` (``mode``: abort | retract | in_place; ``abort`` also ends the
  requests in flight with finish type ``abort``) and ``/continue_generation``: while
  paused, new generations wait.

Its policy is deterministic: ``reply(input_ids)`` gives the tokens it samples (by default
``REPLY`` then the EOS id), and token j's logprob is ``logprob(j, token, load_count)``, so a
test can tell which weights answered. Every request body is kept in ``.calls``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from tests.support.app_thread_standin import ThreadedStandin

# SamplingParams' API fields (sampling_params.py); anything else is SamplingParams(**params)'s TypeError
SAMPLING_FIELDS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "custom_params",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
}
PAUSE_MODES = ("abort", "retract", "in_place")
EOS = 1
REPLY = [11, 12, 13, 14, 15, 16]


def logprob(j: int, token: int, loads: int) -> float:
    """The logprob the stand-in reports for the j-th sampled token after ``loads`` weight loads."""
    return -round(0.001 * (1 + j) + 0.0001 * (token % 97) + 0.1 * loads, 6)


class SGLangStandin(ThreadedStandin):
    """The app and its state; ``start()`` serves it in a thread and returns the URL."""

    def __init__(
        self,
        model_path: str = "/models/tiny",
        served_model_name: str | None = None,
        context_length: int = 2048,
        eos_token_id: int = EOS,
        reply: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        self.model_path = model_path
        self.served_model_name = served_model_name or model_path
        self.context_length = context_length
        self.eos = eos_token_id
        self.reply = reply or (lambda input_ids: [*REPLY, self.eos])
        self.weight_version = "default"
        self.loads = 0  # successful weight loads
        self.loaded_from: list[str] = []
        self.generation_s = 0.01  # how long a generation takes (an abort ends it sooner)
        self.paused: str | None = None  # the pause mode, while paused
        self._resumed = asyncio.Event()
        self._inflight: set[asyncio.Future[None]] = set()
        self.calls: list[tuple[str, Any]] = []
        self.app = self._build()

    # ---- SGLang's behaviour ------------------------------------------------------------------
    def sampling_error(self, params: Any) -> str | None:
        if not isinstance(params, dict):
            return "sampling_params must be an object"
        unknown = sorted(set(params) - SAMPLING_FIELDS)
        if unknown:
            return f"SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'"
        temperature = params.get("temperature", 1.0)
        top_p = params.get("top_p", 1.0)
        top_k = params.get("top_k", -1)
        top_k = -1 if top_k is None else top_k
        if temperature is not None and 0 <= temperature < 1e-6:
            top_k = 1  # greedy
        if temperature is not None and temperature < 0:
            return f"temperature must be a non-negative finite number, got {temperature}."
        if top_p is not None and not 0.0 < top_p <= 1.0:
            return f"top_p must be in (0, 1], got {top_p}."
        if top_k < 1 and top_k != -1:
            return f"top_k must be -1 (disable) or at least 1, got {top_k}."
        max_new = params.get("max_new_tokens", 128)
        if max_new is not None and max_new < 0:
            return f"max_new_tokens must be at least 0, got {max_new}."
        return None

    def generate(self, body: dict[str, Any], rid: str) -> dict[str, Any]:
        input_ids = body.get("input_ids")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", 128)
        max_new = 128 if max_new is None else int(max_new)
        stops = set(params.get("stop_token_ids") or ())
        if not params.get("ignore_eos"):
            stops.add(self.eos)
        out: list[int] = []
        finish: dict[str, Any] = {"type": "length", "length": max_new}
        for token in self.reply(list(input_ids)):
            if len(out) == max_new:
                break
            out.append(token)
            if token in stops:
                finish = {"type": "stop", "matched": token}
                break
        logprobs = [[logprob(j, t, self.loads), t, None] for j, t in enumerate(out)]
        ids = out
        if finish["type"] == "stop" and not params.get("no_stop_trim"):
            ids = out[:-1]
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "weight_version": self.weight_version,
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "e2e_latency": 0.0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = logprobs
        return {"text": " ".join(f"<{t}>" for t in ids), "output_ids": ids, "meta_info": meta}

    def load_from_disk(self, model_path: str) -> str | None:
        """SGLang reloads a model directory: its config and safetensors must be there."""
        directory = Path(model_path)
        if not directory.is_dir():
            return f"{model_path} is not a directory (SGLang loads a model directory)"
        if not (directory / "config.json").is_file():
            return f"no config.json in {model_path}"
        if not list(directory.glob("*.safetensors")):
            return f"no *.safetensors in {model_path}"
        return None

    def _build(self) -> FastAPI:
        app = FastAPI()
        state = self

        def error(message: str, status: int = 400) -> JSONResponse:
            return JSONResponse(
                {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": status},
                status_code=status,
            )

        async def body_of(request: Request, name: str) -> dict[str, Any]:
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            state.calls.append((name, body))
            return body

        def done(success: bool, message: str, **extra: Any) -> JSONResponse:
            return JSONResponse({"success": success, "message": message, **extra}, status_code=200 if success else 400)

        def version_error(body: dict[str, Any], key: str = "weight_version") -> str | None:
            value = body.get(key)
            if value is not None and not isinstance(value, str):
                return f"{key}: Input should be a valid string (got {type(value).__name__})"
            return None

        @app.get("/health")
        async def health() -> PlainTextResponse:
            return PlainTextResponse("")

        @app.get("/get_model_info")
        async def model_info() -> dict[str, Any]:
            return {
                "model_path": state.model_path,
                "tokenizer_path": state.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": state.weight_version,
            }

        @app.get("/get_weight_version")
        async def weight_version() -> dict[str, Any]:
            return {"weight_version": state.weight_version}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {
                "object": "list",
                "data": [
                    {
                        "id": state.served_model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "sglang",
                        "root": state.model_path,
                        "max_model_len": state.context_length,
                    }
                ],
            }

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> PlainTextResponse:
            state.calls.append(("/flush_cache", None))
            return PlainTextResponse("Cache flushed.\n")

        @app.post("/generate")
        async def generate(request: Request) -> JSONResponse:
            body = await body_of(request, "/generate")
            if body.get("stream"):
                return error("the stand-in does not stream")
            if (body.get("text") is None) == (body.get("input_ids") is None):
                return error("Either text or input_ids should be provided.")
            if body.get("input_ids") is None:
                return error("the stand-in takes input_ids only")
            problem = state.sampling_error(body.get("sampling_params") or {})
            if problem:
                return error(problem)
            rid = body.get("rid") or f"standin-{len(state.calls)}"
            while state.paused is not None:
                await state._resumed.wait()
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            state._inflight.add(future)
            try:  # generation takes a moment, during which an abort may end it
                await asyncio.wait_for(asyncio.shield(future), timeout=state.generation_s)
            except asyncio.TimeoutError:
                pass
            finally:
                state._inflight.discard(future)
            if future.done() and future.result() == "abort":
                meta = {
                    "id": rid,
                    "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": 0,
                    "cached_tokens": 0,
                    "weight_version": state.weight_version,
                    "e2e_latency": 0.0,
                }
                if body.get("return_logprob"):
                    meta["output_token_logprobs"] = []
                return JSONResponse({"text": "", "output_ids": [], "meta_info": meta})
            return JSONResponse(state.generate(body, rid))

        def abort_inflight() -> int:
            futures = [f for f in state._inflight if not f.done()]
            for f in futures:
                f.set_result("abort")
            return len(futures)

        @app.post("/update_weights_from_disk")
        async def update_from_disk(request: Request) -> JSONResponse:
            body = await body_of(request, "/update_weights_from_disk")
            if not isinstance(body.get("model_path"), str):
                return error("model_path: Field required")
            problem = version_error(body) or state.load_from_disk(body["model_path"])
            if problem:
                return done(False, problem, num_paused_requests=0)
            paused = abort_inflight() if body.get("abort_all_requests") else 0
            state.loads += 1
            state.loaded_from.append(body["model_path"])
            message = "Succeeded to update model weights."
            if body.get("weight_version") is not None:
                state.weight_version = body["weight_version"]
                message += f" Weight version updated to {state.weight_version}."
            return done(True, message, num_paused_requests=paused)

        @app.post("/update_weights_from_tensor")
        async def update_from_tensor(request: Request) -> JSONResponse:
            body = await body_of(request, "/update_weights_from_tensor")
            tensors = body.get("serialized_named_tensors")
            if not isinstance(tensors, list) or not tensors:
                return error("serialized_named_tensors: one entry per TP rank is required")
            problem = version_error(body)
            if problem:
                return done(False, problem)
            state.loads += 1
            if body.get("weight_version") is not None:
                state.weight_version = body["weight_version"]
            return done(True, "Succeeded to update model weights.")

        @app.post("/init_weights_update_group")
        async def init_group(request: Request) -> JSONResponse:
            body = await body_of(request, "/init_weights_update_group")
            missing = [k for k in ("master_address", "master_port", "rank_offset", "world_size") if k not in body]
            if missing:
                return error(f"{missing[0]}: Field required")
            return done(True, "Succeeded to initialize custom process group.")

        @app.post("/update_weights_from_distributed")
        async def update_from_distributed(request: Request) -> JSONResponse:
            body = await body_of(request, "/update_weights_from_distributed")
            names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
            if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
                return error("names, dtypes and shapes are required lists")
            if not len(names) == len(dtypes) == len(shapes):
                return done(False, "names, dtypes and shapes differ in length")
            problem = version_error(body)
            if problem:
                return done(False, problem)
            state.loads += 1
            if body.get("weight_version") is not None:
                state.weight_version = body["weight_version"]
            return done(True, "Succeeded to update parameter online.")

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request) -> JSONResponse:
            body = await body_of(request, "/update_weight_version")
            if not isinstance(body.get("new_version"), str):
                return error("new_version: Input should be a valid string")
            if body.get("abort_all_requests"):
                abort_inflight()
            state.weight_version = body["new_version"]
            return JSONResponse(
                {
                    "success": True,
                    "message": f"Weight version updated to {state.weight_version}",
                    "new_version": state.weight_version,
                }
            )

        @app.post("/pause_generation")
        async def pause(request: Request) -> JSONResponse:
            body = await body_of(request, "/pause_generation")
            mode = body.get("mode", "abort")
            if mode not in PAUSE_MODES:
                return error(f"Invalid mode: {mode!r}. Expected one of {list(PAUSE_MODES)}.")
            state._resumed.clear()
            state.paused = mode
            if mode == "abort":
                abort_inflight()
            return JSONResponse({"message": "Generation paused successfully."})

        @app.post("/continue_generation")
        async def resume(request: Request) -> JSONResponse:
            await body_of(request, "/continue_generation")
            state.paused = None
            state._resumed.set()
            return JSONResponse({"message": "Generation continued successfully."})

        return app


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
