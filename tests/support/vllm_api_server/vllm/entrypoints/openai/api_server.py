"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` that speaks vLLM's API where agentgym
meets it, and samples from a real model: for CPU tests of agentgym with ``rollout.name=vllm`` (no vLLM
build runs on a CPU machine like CI's; tests/server/test_vllm_real.py runs the real one where it can).

It is what ``agentgym.server.launchers`` starts as vLLM when this directory is first on the engine's
``PYTHONPATH`` (``AGENTGYM_VLLM_PYTHON`` pointing at an interpreter wrapper that puts it there):

* its command line: vLLM's (``--model``, ``--served-model-name``, ``--host``, ``--port``,
  ``--max-model-len``, ``--dtype``, ``--worker-extension-cls``; the others are accepted and ignored);
* generation: agentgym's embedded server app on the model (``POST /v1/completions`` with token ids,
  ``/v1/chat/completions``, ``GET /health``, ``/v1/models``), its answers without the
  ``weight_version`` field vLLM's do not have, so clients must track versions as they do for vLLM;
* weights, only with ``VLLM_SERVER_DEV_MODE=1`` (vLLM's dev routes): ``POST /pause?mode=wait|abort``,
  ``/resume``, ``/reset_prefix_cache`` and ``/collective_rpc`` (``{"method", "args"}``) calling
  ``method`` on a worker built as vLLM builds one: the class ``--worker-extension-cls`` names
  (agentgym's real ``agentgym_vllm_extension.VLLMWorkerWeights``, imported from the ``PYTHONPATH``)
  mixed into a worker whose ``model_runner.model.load_weights(weights=...)`` takes the tensors, as
  vLLM's models do; they go into the served model as one new version. No ``/update_weight_version``
  (a 404, as on a vLLM without it).

``$AGENTGYM_VLLM_STANDIN_RECORD`` (a directory): each load appends a JSON line to ``<pid>.jsonl`` there
(``host``, ``pid``, the ``path`` it read, ``tensors``, ``version``: the served model's version after it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response


class ModelAdapter:
    """``model_runner.model`` as the worker extension sees it: vLLM's ``load_weights(weights=iterable)``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.loaded: dict[str, Any] = {}

    def load_weights(self, weights: Any) -> set[str]:
        self.loaded.update(dict(weights))
        return set(self.loaded)

    def parameters(self) -> Any:
        return self.engine.model.parameters()


def make_worker(extension: str, engine: Any) -> Any:
    """A worker object of ``extension`` (``module.Class``) mixed in, as vLLM's ``--worker-extension-cls``."""
    module, _, name = extension.rpartition(".")
    cls = getattr(importlib.import_module(module), name)

    class Worker(cls):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.model_runner = SimpleNamespace(
                model=ModelAdapter(engine), model_config=SimpleNamespace(hf_config=engine.model.config)
            )

    return Worker()


def main(argv: list[str]) -> None:
    import uvicorn

    from agentgym.server.app import build_app
    from agentgym.server.launch import create_engine

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--dtype")
    parser.add_argument("--worker-extension-cls")
    args, _ = parser.parse_known_args(argv)
    name = args.served_model_name or args.model
    engine = create_engine(args.model, dtype=args.dtype, max_model_len=args.max_model_len, served_model_name=name)
    app = build_app(engine, name)
    server = app.state.server
    record = os.environ.get("AGENTGYM_VLLM_STANDIN_RECORD")

    @app.middleware("http")
    async def as_vllm_answers(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        if request.url.path != "/v1/completions" or response.headers.get("content-type") != "application/json":
            return response
        body = json.loads(b"".join([chunk async for chunk in response.body_iterator]))
        body.pop("weight_version", None)
        for choice in body.get("choices", []):
            choice.pop("weight_version", None)
        return JSONResponse(body, status_code=response.status_code)

    if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
        worker = make_worker(args.worker_extension_cls, engine) if args.worker_extension_cls else None

        @app.post("/pause")
        async def pause(mode: str = "abort") -> dict:
            await asyncio.wrap_future(engine.pause("abort" if mode == "abort" else "wait"))
            return {}

        @app.post("/resume")
        async def resume() -> dict:
            server.resume()
            return {}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> Response:
            return Response(status_code=200)

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> Any:
            body = await request.json()
            method = getattr(worker, str(body["method"]), None)
            if method is None:
                return JSONResponse({"error": f"no worker method {body['method']!r}"}, status_code=500)
            result = await asyncio.to_thread(method, *body.get("args", []), **body.get("kwargs", {}))
            state, worker.model_runner.model.loaded = worker.model_runner.model.loaded, {}
            if state:
                await asyncio.wrap_future(engine.update_weights(state))
                if record:
                    Path(record).mkdir(parents=True, exist_ok=True)
                    line = {
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "path": (body.get("args") or [None])[0],
                        "tensors": len(state),
                        "version": engine.weight_version,
                    }
                    with open(Path(record) / f"{os.getpid()}.jsonl", "a") as f:
                        f.write(json.dumps(line) + "\n")
            return {"results": [result]}

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
