"""Weight pushes without serialization: an in-process engine that shares the trainer's tensors,
a server process that maps them (shared memory here; CUDA IPC on a GPU), and bucketed
pushes for servers on other machines. Each check generates with the pushed weights and
compares with a teacher-forced forward of the model that holds them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest
import torch
from omegaconf import OmegaConf

from agentgym.model import load_causal_lm, load_tokenizer
from agentgym.model.weights import bind_state_dict, buckets, open_handles, share_handles
from agentgym.server.engine import Engine
from agentgym.server.handles import EmbeddedServerHandle
from agentgym.server.sampling import GenerationParams
from agentgym.trainer.rollout_servers import is_local_url
from agentgym.trainer.weight_sync import WeightSync

PROMPT = list(range(5, 40))


def perturb(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))  # at 0.3: float32 gaps within 3x of 1e-4


def logprob_gap(model, result):
    """Largest gap between a completion's logprobs and a teacher-forced forward of ``model``."""
    tokens = result["token_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([PROMPT + tokens])).logits[0].float(), -1)
    expected = [lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(tokens)]
    return max(abs(a - b) for a, b in zip(result["logprobs"], expected))


def complete(url):
    body = {"prompt": PROMPT, "max_tokens": 8, "logprobs": 0, "ignore_eos": True}
    choice = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    return {"token_ids": choice["token_ids"], "logprobs": choice["logprobs"]["token_logprobs"]}


def generate(engine):
    async def go():
        seq = (await engine.submit(PROMPT, GenerationParams(max_tokens=8, ignore_eos=True)).done)[0]
        return {
            "token_ids": seq.output_ids,
            "logprobs": seq.logprobs,
            "cached": seq.cached_tokens,
            "version": seq.weight_version,
        }

    return asyncio.run(go())


# ---- in this process: the engine's weights are the trainer's tensors ---------------------------------
def test_a_shared_engine_sees_in_place_updates_at_the_next_version():
    trainer = load_causal_lm("tiny")
    engine = Engine(load_causal_lm("tiny"), load_tokenizer("tiny"), max_batch_size=4).start()
    try:
        state = {k: v.detach() for k, v in trainer.state_dict().items()}
        assert engine.share_weights(state, 1).result(timeout=30) == 1
        ptr = trainer.model.embed_tokens.weight.data_ptr()
        assert engine.model.model.embed_tokens.weight.data_ptr() == ptr == engine.model.lm_head.weight.data_ptr()
        first = generate(engine)
        assert logprob_gap(trainer, first) < 1e-4
        perturb(trainer, 1)  # an optimizer step: in place
        assert engine.new_version(2).result(timeout=30) == 2
        second = generate(engine)
        assert second["version"] == 2 and second["cached"] == 0  # the old weights' cache is gone
        assert logprob_gap(trainer, second) < 1e-4
    finally:
        engine.stop()


def test_tensors_of_another_dtype_are_not_bound():
    model = load_causal_lm("tiny")
    before = model.model.embed_tokens.weight.data_ptr()
    assert not bind_state_dict(model, {k: v.double() for k, v in model.state_dict().items()})
    assert not bind_state_dict(model, {"not.a.weight": torch.zeros(1)})
    assert model.model.embed_tokens.weight.data_ptr() == before


def test_weight_sync_binds_once_then_only_moves_versions():
    trainer = load_causal_lm("tiny")
    worker = SimpleNamespace(
        config=OmegaConf.create({"actor_rollout_ref": {"hybrid_engine": True}}),
        full_state_dict=lambda: {k: v.detach() for k, v in trainer.state_dict().items()},
    )
    actor = SimpleNamespace(use_ray=False, workers=[worker], call_rank0=lambda name: getattr(worker, name)())
    handle = EmbeddedServerHandle(Engine(load_causal_lm("tiny"), load_tokenizer("tiny"), max_batch_size=4).start())

    class Servers:
        handles = [handle]

        def in_process_handles(self):
            return self.handles

    try:
        sync = WeightSync(Servers(), actor, "tiny")
        assert sync.direct and sync.share
        metrics = asyncio.run(sync.push(1))
        assert sync.shared and metrics["weight_sync/version"] == 1
        perturb(trainer, 2)
        asyncio.run(sync.push(2))
        out = complete(handle.url)
        assert handle.engine.weight_version == 2 and logprob_gap(trainer, out) < 1e-4
        # the asynchronous trainer trains while servers generate: it never shares
        worker.config = OmegaConf.create({"actor_rollout_ref": {"hybrid_engine": False}})
        assert not WeightSync(Servers(), actor, "tiny").share
    finally:
        handle.stop()


# ---- another process on this host: it maps the trainer's memory -------------------------------------
def test_ray_workers_hand_the_servers_handles_of_their_memory():
    """The default layout (Ray workers, embedded servers in the driver): the rank-0 worker returns
    handles (``PolicyWorker.weight_handles``), the driver's servers map them and copy once."""
    trainer = load_causal_lm("tiny")
    calls = []

    def call_rank0(name):
        calls.append(name)
        return share_handles({k: v.detach() for k, v in trainer.state_dict().items()})

    actor = SimpleNamespace(use_ray=True, call_rank0=call_rank0)
    handle = EmbeddedServerHandle(Engine(load_causal_lm("tiny"), load_tokenizer("tiny"), max_batch_size=4).start())

    class Servers:
        handles = [handle]

        def in_process_handles(self):
            return []  # as seen by a Ray trainer: the actor is elsewhere

        def loads_state_dicts(self):
            return True

    try:
        sync = WeightSync(Servers(), actor, "tiny")
        assert sync.handles and not sync.direct
        for version, seed in ((1, 6), (2, 7)):
            perturb(trainer, seed)
            metrics = asyncio.run(sync.push(version))
            assert metrics["weight_sync/version"] == version and handle.engine.weight_version == version
            assert logprob_gap(trainer, complete(handle.url)) < 1e-4
        assert calls == ["weight_handles"] * 2
        assert len(sync._mapped) > 0  # the same memory, kept mapped between pushes
    finally:
        handle.stop()


def test_handles_open_the_same_memory_in_another_process(tmp_path):
    base = torch.arange(12, dtype=torch.float32).view(3, 4)
    state = {"a": base, "view": base[1:, 1:], "half": torch.randn(5).bfloat16()}
    handles = share_handles(state)
    assert json.loads(json.dumps(handles)) == handles  # plain JSON, nothing pickled
    assert base.untyped_storage().is_shared()
    (tmp_path / "h.json").write_text(json.dumps(handles))
    expected = {k: v.float().tolist() for k, v in state.items()}
    code = (
        "import json, sys; from agentgym.model.weights import open_handles; "
        f"t = open_handles(json.load(open({str(tmp_path / 'h.json')!r}))); "
        "print(json.dumps({k: v.float().tolist() for k, v in t.items()})); t['a'][0, 0] = -7"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == expected
    assert base[0, 0] == -7  # the other process wrote into this one's tensor: the same memory
    with pytest.raises(ValueError, match="kind"):
        open_handles({"x": {**handles["a"], "kind": "pickle"}})


def test_the_receiver_outlives_the_sender_and_its_shm_manager(tmp_path):
    """Ray kills its workers (and their torch shm manager) before the driver drops the memory it
    mapped from them: dropping it then must not abort the receiver (it did: "Broken pipe")."""
    import os
    import signal

    psutil = pytest.importorskip("psutil")
    handles_file = tmp_path / "h.json"
    sender = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, time, torch; from agentgym.model.weights import share_handles; "
            "t = torch.arange(1000.0); h = share_handles({'t': t}); "
            f"open({str(tmp_path / 'tmp.json')!r}, 'w').write(json.dumps(h)); "
            f"__import__('os').rename({str(tmp_path / 'tmp.json')!r}, {str(handles_file)!r}); time.sleep(120)",
        ],
        start_new_session=True,
    )
    receiver = None
    try:
        for _ in range(600):
            if handles_file.exists():
                break
            assert sender.poll() is None
            time.sleep(0.1)
        receiver = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import gc, json, sys; from agentgym.model.weights import open_handles; "
                f"t = open_handles(json.load(open({str(handles_file)!r}))); print(float(t['t'].sum()), flush=True); "
                "sys.stdin.readline(); del t; gc.collect(); print('dropped', flush=True)",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert receiver.stdout.readline().strip() == str(float(sum(range(1000))))
        for child in psutil.Process(sender.pid).children(recursive=True):  # its shm manager (Ray kills those)
            child.kill()
        os.killpg(sender.pid, signal.SIGKILL)
        sender.wait(timeout=30)
        time.sleep(0.5)
        out, err = receiver.communicate("go\n", timeout=60)
        assert receiver.returncode == 0, err[-2000:]
        assert out.strip() == "dropped"
    finally:
        for proc in (sender, receiver):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_a_server_process_loads_the_trainers_memory_through_handles():
    from agentgym.server.launch import start_embedded_server

    server = start_embedded_server("tiny", in_process=False, timeout=120)
    try:
        trainer = load_causal_lm("tiny")
        perturb(trainer, 3)
        state = dict(trainer.state_dict())
        answer = server.weights.update_from_handles(server.url, state, 4)
        assert answer["success"] and "shared tensors" in answer["message"] and answer["weight_version"] == 4
        assert logprob_gap(trainer, complete(server.url)) < 1e-4
        perturb(trainer, 4)  # in place, in the shared memory: pushing again sends the same handles
        assert server.update_weights(state, 5) == 5
        assert logprob_gap(trainer, complete(server.url)) < 1e-4
    finally:
        server.stop()


# ---- another machine: buckets over HTTP ------------------------------------------------------------
def test_bucketed_pushes_load_all_at_once_at_the_last_bucket():
    from agentgym.client.weights import EmbeddedWeights

    handle = EmbeddedServerHandle(Engine(load_causal_lm("tiny"), load_tokenizer("tiny"), max_batch_size=4).start())
    try:
        original = load_causal_lm("tiny")
        trainer = load_causal_lm("tiny")
        perturb(trainer, 5)
        state = dict(trainer.state_dict())
        sizes = {f"t{i}": torch.zeros(2**17) for i in range(5)}  # 0.5 MB each: buckets of 1 MB hold two
        assert [list(p) for p in buckets(sizes, 1)] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
        from safetensors.torch import save

        unique = [(k, v) for k, v in state.items() if k != "lm_head.weight"]
        parts = [dict(unique[i::4]) for i in range(4)]
        headers = {"Authorization": f"Bearer {handle.admin_key}", "Content-Type": "application/octet-stream"}
        for i, part in enumerate(parts[:-1]):
            r = httpx.post(
                f"{handle.url}/update_weights_from_tensor?weight_version=9&bucket={i}&buckets={len(parts)}",
                content=save({k: v.contiguous() for k, v in part.items()}),
                headers=headers,
            )
            assert r.json()["success"] and "held" in r.json()["message"]
        assert handle.engine.weight_version == 0 and logprob_gap(original, complete(handle.url)) < 1e-4
        answer = EmbeddedWeights(admin_key=handle.admin_key).update_in_buckets(handle.url, state, 10, bucket_mb=1)
        assert answer["weight_version"] == 10 and logprob_gap(trainer, complete(handle.url)) < 1e-4
        bad = httpx.post(
            f"{handle.url}/update_weights_from_tensor?weight_version=11&bucket=5&buckets=2",
            content=save({"x": torch.zeros(1)}),
            headers=headers,
        )
        assert httpx.post(f"{handle.url}/update_weights_from_ipc", json={"tensors": {}}).status_code == 401
        assert bad.status_code == 400 and handle.engine.weight_version == 10
    finally:
        handle.stop()


def test_local_and_remote_urls():
    assert is_local_url("http://127.0.0.1:8000") and is_local_url("http://localhost:1")
    assert not is_local_url("http://192.0.2.7:8000")  # TEST-NET-1: never this machine
    assert not is_local_url("http://no-such-host.invalid:80")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_travel_as_ipc_handles(tmp_path):
    state = {"w": torch.randn(64, 64, device="cuda"), "b": torch.randn(64, device="cuda").bfloat16()}
    handles = share_handles(state)
    assert {h["kind"] for h in handles.values()} == {"cuda"}
    (tmp_path / "h.json").write_text(json.dumps(handles))
    code = (
        "import json, torch; from agentgym.model.weights import open_handles; "
        f"t = open_handles(json.load(open({str(tmp_path / 'h.json')!r}))); "
        "print(json.dumps({k: float(v.float().sum()) for k, v in t.items()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sums = json.loads(out.stdout)
    assert all(abs(sums[k] - float(v.float().sum())) < 1e-3 for k, v in state.items())
