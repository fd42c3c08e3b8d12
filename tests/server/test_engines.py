"""vLLM / SGLang launchers and weight adapters, checked against stand-ins (a real vLLM:
tests/server/test_vllm_real.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentgym.client.weights import SGLangWeights, VLLMWeights
from agentgym.model import load_causal_lm
from agentgym.server.handles import AppThread, SubprocessServerHandle, free_port
from agentgym.server.launch import start_embedded_server
from agentgym.server.launchers import (
    VLLM_EXTENSION,
    VLLM_EXTENSION_DIR,
    engine_available,
    engine_environment,
    sglang_command,
    start_engine_server,
    vllm_command,
)


def vllm_extension():
    """The worker extension module as vLLM imports it: by its top-level name, from its directory."""
    import importlib

    sys.path.insert(0, str(VLLM_EXTENSION_DIR))
    try:
        return importlib.import_module(VLLM_EXTENSION.split(".")[0])
    finally:
        sys.path.remove(str(VLLM_EXTENSION_DIR))


def test_command_lines():
    cmd = vllm_command(
        "/m",
        port=8123,
        served_model_name="tiny",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
        max_model_len=2048,
        python="py",
    )
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(cmd)
    for part in (
        "--model /m",
        "--served-model-name tiny",
        "--port 8123",
        "--tensor-parallel-size 2",
        "--gpu-memory-utilization 0.5",
        "--max-model-len 2048",
        "--enable-auto-tool-choice",
        "--tool-call-parser hermes",
        "--worker-extension-cls agentgym_vllm_extension.VLLMWorkerWeights",
    ):
        assert part in text
    cmd = sglang_command(
        "/m",
        port=30001,
        tensor_parallel_size=4,
        gpu_memory_utilization=0.7,
        max_model_len=4096,
        python="py",
        extra_args=["--skip-server-warmup"],
    )
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"] and cmd[-1] == "--skip-server-warmup"
    text = " ".join(cmd)
    for part in (
        "--model-path /m",
        "--port 30001",
        "--tp 4",
        "--mem-fraction-static 0.7",
        "--context-length 4096",
        "--tool-call-parser qwen25",
    ):
        assert part in text


@pytest.fixture(scope="module")
def stand_in():
    """Records every call; routes that a given engine version lacks answer 404."""
    calls: list[tuple[str, dict, object]] = []
    missing: set[str] = set()
    app = FastAPI()

    @app.post("/{path:path}")
    async def record(path: str, request: Request) -> JSONResponse:
        raw = await request.body()
        body = await request.json() if raw else None
        calls.append(("/" + path, dict(request.query_params), body))
        if "/" + path in missing:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse({"success": True, "message": "ok"})

    server = AppThread(app)
    yield SimpleNamespace(url=server.url, calls=calls, missing=missing)
    server.stop()


def test_vllm_adapter_pauses_loads_through_the_worker_extension_and_resumes(stand_in):
    stand_in.calls.clear()
    VLLMWeights().update_from_disk(stand_in.url, "/dev/shm/w", 3)
    assert [(p, q, b) for p, q, b in stand_in.calls] == [
        ("/pause", {"mode": "wait"}, None),
        ("/collective_rpc", {}, {"method": "agentgym_load_weights", "args": ["/dev/shm/w"]}),
        ("/reset_prefix_cache", {}, None),
        ("/update_weight_version", {}, {"new_version": "3"}),
        ("/resume", {}, None),
    ]
    # an older vLLM without pause/version routes: load and reset only
    stand_in.calls.clear()
    stand_in.missing.update({"/pause", "/update_weight_version"})
    try:
        VLLMWeights().update_from_disk(stand_in.url, "/dev/shm/w", 4)
    finally:
        stand_in.missing.clear()
    assert [p for p, _, _ in stand_in.calls] == [
        "/pause",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
    ]


def test_sglang_adapter_routes(stand_in, tmp_path):
    stand_in.calls.clear()
    (tmp_path / "config.json").write_text("{}")
    weights = SGLangWeights(model_dir=tmp_path)
    weights.update_from_disk(stand_in.url, "/ckpt", 1)
    weights.update_from_tensors(stand_in.url, {"w": torch.zeros(2)}, 2, tp_size=2, serialize=lambda items: "blob")
    weights.init_weights_update_group(stand_in.url, "10.0.0.1", 29500, 1, 3)
    weights.update_from_distributed(stand_in.url, ["w"], ["bfloat16"], [[2]], 4)
    weights.pause(stand_in.url)
    weights.resume(stand_in.url)
    weights.update_from_state_dict(stand_in.url, {"w": torch.ones(2)}, 5)
    paths = [p for p, _, _ in stand_in.calls]
    assert paths == [
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/init_weights_update_group",
        "/update_weights_from_distributed",
        "/pause_generation",
        "/continue_generation",
        "/update_weights_from_disk",
    ]
    bodies = [b for _, _, b in stand_in.calls]
    assert bodies[0] == {"model_path": "/ckpt", "weight_version": "1", "abort_all_requests": False}
    assert bodies[1] == {
        "serialized_named_tensors": ["blob", "blob"],
        "load_format": None,
        "flush_cache": True,
        "weight_version": "2",
    }
    assert bodies[2] == {
        "master_address": "10.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 3,
        "group_name": "weight_update_group",
        "backend": "nccl",
    }
    assert bodies[3]["names"] == ["w"] and bodies[3]["dtypes"] == ["bfloat16"] and bodies[3]["shapes"] == [[2]]
    pushed = bodies[6]["model_path"]
    assert bodies[6]["weight_version"] == "5" and not os.path.exists(pushed)  # written, loaded, removed
    # a single safetensors file (what the trainer writes) reaches SGLang as a model directory
    from agentgym.model.weights import save_for_push

    seen = {}
    weights._post = lambda url, path, body: seen.update(files=sorted(os.listdir(body["model_path"])))
    weights.update_from_disk(stand_in.url, str(save_for_push({"w": torch.ones(2)}, tmp_path / "p.safetensors")), 6)
    assert seen["files"] == ["config.json", "model.safetensors"]


def test_vllm_worker_extension_loads_a_pushed_file(tmp_path):
    from agentgym.model.weights import save_for_push

    received = {}
    fake_model = SimpleNamespace(
        load_weights=lambda weights: received.update(dict(weights)), parameters=lambda: iter([torch.zeros(1)])
    )
    worker = vllm_extension().VLLMWorkerWeights()
    worker.model_runner = SimpleNamespace(model=fake_model, model_config=None)
    path = save_for_push({"a": torch.ones(3), "b": torch.zeros(2)}, tmp_path / "w.safetensors")
    assert worker.agentgym_load_weights(str(path)) == 2
    assert torch.equal(received["a"], torch.ones(3)) and set(received) == {"a", "b"}
    # newer vLLM: the runner's in-place reload; a tied lm_head is sent along with the embedding
    reloaded = {}

    def reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        reloaded.update(dict(weights_iterator))

    worker.model_runner = SimpleNamespace(
        reload_weights=reload_weights, model_config=SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=True))
    )
    path = save_for_push({"model.embed_tokens.weight": torch.ones(4, 2)}, tmp_path / "e.safetensors")
    worker.agentgym_load_weights(str(path))
    assert set(reloaded) == {"model.embed_tokens.weight", "lm_head.weight"}


# Imported by the worker processes of a vLLM that has none of agentgym's dependencies: only the
# standard library, torch and vLLM may be imported (and not agentgym itself: its __init__ needs gymnasium).
BLOCKED = (
    "agentgym",
    "gymnasium",
    "ray",
    "fastapi",
    "uvicorn",
    "transformers",
    "tokenizers",
    "safetensors",
    "httpx",
    "omegaconf",
    "yaml",
    "numpy",
    "jinja2",
    "openai",
    "pydantic",
)
IMPORT_IN_VLLM_ENV = """
import importlib.abc, sys
BLOCKED = {blocked!r}

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the vLLM environment)")
        return None

sys.meta_path.insert(0, Blocker())
import importlib, json, types
module, cls = {extension!r}.rsplit(".", 1)
worker = getattr(importlib.import_module(module), cls)()
got = {{}}
model = types.SimpleNamespace(load_weights=lambda weights: got.update(dict(weights)),
                              parameters=lambda: iter([]))
worker.model_runner = types.SimpleNamespace(model=model, model_config=None)
count = worker.agentgym_load_weights(sys.argv[1])
print(json.dumps({{"count": count, "sums": {{k: float(v.float().sum()) for k, v in got.items()}},
                  "loaded": sorted(m.split(".")[0] for m in sys.modules)}}))
"""


def test_vllm_extension_imports_nothing_but_the_standard_library_torch_and_vllm(tmp_path):
    """What ``agentgym serve --engine vllm`` launches: the extension named on vLLM's command line,
    found through the environment the engine gets, in a Python where agentgym and its other
    dependencies cannot be imported. It must load a pushed file (a model directory here)."""
    from agentgym.model.weights import save_for_push

    command = vllm_command("/m", python=sys.executable)
    extension = command[command.index("--worker-extension-cls") + 1]
    save_for_push(
        {"w": torch.ones(3, dtype=torch.bfloat16), "b": torch.full((2,), 2.0)}, tmp_path / "model.safetensors"
    )
    (tmp_path / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(engine_environment("vllm"))
    script = IMPORT_IN_VLLM_ENV.format(blocked=BLOCKED, extension=extension)
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["count"] == 2 and result["sums"] == {"w": 3.0, "b": 4.0}
    assert not set(result["loaded"]) & set(BLOCKED)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_subprocess_handle_reports_the_log_tail_and_stops_the_group():
    url = f"http://127.0.0.1:{free_port()}"
    dead = SubprocessServerHandle(
        [sys.executable, "-c", "print('CUDA out of memory'); raise SystemExit(3)"], url, "vllm", "m", VLLMWeights()
    )
    with pytest.raises(RuntimeError, match="(?s)exited with code 3.*CUDA out of memory"):
        dead.wait_ready(timeout=30, interval=0.05)
    dead.stop()
    slow = SubprocessServerHandle(
        [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"],
        url,
        "sglang",
        "m",
        SGLangWeights(),
        grace=5,
    )
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="(?s)did not answer /health.*loading"):
        slow.wait_ready(timeout=1.0, interval=0.1)
    assert slow.process.poll() is not None and time.monotonic() - start < 10


def test_missing_engine_says_what_to_do():
    if engine_available("sglang"):
        pytest.skip("sglang is installed here")
    with pytest.raises(RuntimeError, match="cannot import 'sglang'.*--engine embedded"):
        start_engine_server("sglang", "tiny")


def test_embedded_server_in_a_child_process_takes_a_state_dict_push():
    handle = start_embedded_server("tiny", in_process=False, timeout=120, served_model_name="policy")
    try:
        # agentgym serve --served-model-name: the API answers to that name, and the handle knows it
        assert [m["id"] for m in httpx.get(handle.url + "/v1/models").json()["data"]] == ["policy"]
        assert handle.model == "policy"
        ok = httpx.post(handle.url + "/v1/completions", json={"model": "policy", "prompt": [1, 2], "max_tokens": 2})
        assert ok.status_code == 200
        wrong = httpx.post(handle.url + "/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 2})
        assert wrong.status_code == 404
        state = {k: v + 1.0 for k, v in load_causal_lm("tiny").state_dict().items() if k != "lm_head.weight"}
        assert handle.update_weights(state, 9) == 9
        assert httpx.get(handle.url + "/weight_version").json() == {"weight_version": 9}
    finally:
        handle.stop()
    assert handle.process.poll() is not None
