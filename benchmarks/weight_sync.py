"""Weight pushes into the embedded server, against a plain state-dict copy of the same tensors.

    python benchmarks/weight_sync.py            # mid-size and Qwen2.5-0.5B-shaped models, CPU fp32
    python benchmarks/weight_sync.py --quick    # the mid-size model only, fewer repeats

For each model, in one process (the "trainer", holding the model's weights, perturbed before
every push so each is a real new version):

* **plain copy**: ``dst[k].copy_(src[k])`` for every tensor into a second copy of the model:
  the baseline, the least any push that leaves the server its own weights can cost;
* **in-process, shared**: an engine in this process whose weights *are* the trainer's tensors
  (``Engine.share_weights`` once; a push is ``new_version``): what the synchronous trainer does;
* **in-process, copy**: ``Engine.update_weights``, the same copy into the engine's weights
  between responses (the asynchronous trainer's in-process servers, checkpoint-engine pushes);
* **server process, handles**: ``agentgym serve`` in a child process; the push sends handles of
  the trainer's shared memory (``/update_weights_from_ipc``) and the server copies once;
* **server process, /dev/shm file**: the trainer writes one safetensors file, the server reads it
  (``/update_weights_from_disk``: the path vLLM/SGLang and Ray workers use);
* **server process, HTTP buckets**: safetensors bodies of ``--bucket-mb`` MB
  (``checkpoint_engine.device_buffer_size_M``), what a server on another machine gets; here over
  loopback, so the network is not measured;
* **Ray object store** (``--ray ADDRESS``, or ``RAY_ADDRESS``): the trainer's rank 0 is a real
  ``PolicyWorker`` on the cluster, on a node offering ``agentgym_trainer_pool`` when one does; a push
  is what ``WeightSync`` does when rank 0 is on another node than the driver: ``weight_buckets``
  (``--bucket-mb`` MB each, ``ray.put`` there), fetched bucket by bucket here, then copied into the
  in-process engine. Run inside ``benchmarks/two_nodes.sh`` the worker is on the second "host" (own
  ``/dev/shm``, Ray's object transfer between two raylets over loopback).

Every row also gives milliseconds per MB pushed.

Each figure is the median of ``--repeats`` pushes with its range; ratios are to the plain copy's
median. Target on CPU: a push <= 1.5x a plain copy. On a GPU the 0.5B-shape target is <= 0.3 s
(run this on a GPU machine with ``--device cuda`` for the in-process rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import MODELS, log  # noqa: E402  (benchmarks/engine.py: the models built there)

from agentgym.model import load_causal_lm, load_tokenizer  # noqa: E402
from agentgym.model.weights import push_dir, save_for_push  # noqa: E402
from agentgym.server.engine import Engine  # noqa: E402
from agentgym.server.launch import start_embedded_server  # noqa: E402


def ray_push(path: str, bucket_mb: float, engine: Engine, version: Any) -> tuple[Any, Any, str]:
    """A rank-0 ``PolicyWorker`` on the Ray cluster (on the trainer pool's node when the cluster has
    one) and a push as ``WeightSync`` makes it when that worker is on another node; returns
    (push function, the worker group to shut down, where rank 0 is)."""
    import ray

    from agentgym.trainer.config import load_config
    from agentgym.trainer.resource_pools import POOL_RESOURCE, cluster_offers, pool_placement_group
    from agentgym.trainer.worker_group import WorkerGroup
    from agentgym.trainer.workers import PolicyWorker

    cfg = load_config(overrides=[f"actor_rollout_ref.model.path={path}", "trainer.cpu_threads_per_worker=1"])
    group = None
    if cluster_offers(POOL_RESOURCE["trainer"]):
        group = pool_placement_group("trainer", 1, 1, False)
    workers = WorkerGroup(PolicyWorker, cfg, 1, True, "bench", 0.0, group)
    workers.call("init_model", 1, False)
    where = "another node" if workers.call_rank0("node_id") != ray.get_runtime_context().get_node_id() else "this node"
    log(f"ray: rank 0 on {where}")

    def push() -> None:
        refs = workers.call("weight_buckets", bucket_mb)[0]
        state: dict[str, Any] = {}
        for ref in refs:
            state.update(ray.get(ref))
        engine.update_weights(state, next(version)).result()

    return push, workers, where


def bench(
    name: str, repeats: int, bucket_mb: float, device: str, server_process: bool, ray_address: str | None = None
) -> None:
    path = MODELS[name]()
    log(f"{name}: loading")
    trainer = load_causal_lm(path, device=device)
    state = dict(trainer.state_dict())
    unique = {k: v for k, v in state.items() if k != "lm_head.weight"}
    size_gb = sum(v.numel() * v.element_size() for v in unique.values()) / 1e9
    gen = torch.Generator(device=device).manual_seed(0)

    def perturb() -> None:  # an optimizer step: in place, so shared tensors stay shared
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.rand(p.shape, generator=gen, device=device).sub_(0.5).mul_(1e-3))

    copy = load_causal_lm(path, device=device)
    targets = dict(copy.state_dict())

    def plain() -> None:
        with torch.no_grad():
            for k, v in unique.items():
                targets[k].copy_(v)
        if device == "cuda":
            torch.cuda.synchronize()

    version = iter(range(1, 100_000))
    engine = Engine(load_causal_lm(path, device=device), load_tokenizer(path), max_batch_size=8).start()
    shared = Engine(load_causal_lm(path, device=device), load_tokenizer(path), max_batch_size=8).start()
    assert shared.share_weights(state, next(version)).result() is not False
    methods = {
        "plain copy": plain,
        "in-process, shared": lambda: shared.new_version(next(version)).result(),
        "in-process, copy": lambda: engine.update_weights(unique, next(version)).result(),
    }
    server = None
    workers = None
    if ray_address:
        from omegaconf import OmegaConf

        from agentgym.trainer.worker_group import init_ray

        init_ray(OmegaConf.create({"ray_init": {"address": ray_address}}))
        push, workers, where = ray_push(path, bucket_mb, engine, version)
        methods[f"Ray object store, rank 0 on {where}, buckets of {bucket_mb:g} MB"] = push

    if server_process:
        log(f"{name}: a server process")
        server = start_embedded_server(path, in_process=False, timeout=900)
        adapter = server.weights  # it holds the server's admin key
        adapter.update_from_handles(server.url, unique, next(version))  # the first push moves them to shared memory

        def by_file() -> None:
            target = save_for_push(unique)
            try:
                adapter.update_from_disk(server.url, str(target), next(version))
            finally:
                target.unlink(missing_ok=True)

        methods["server process, handles"] = lambda: adapter.update_from_handles(server.url, unique, next(version))
        methods["server process, /dev/shm file"] = by_file
        methods[f"server process, HTTP buckets of {bucket_mb:g} MB"] = lambda: adapter.update_in_buckets(
            server.url, unique, next(version), bucket_mb
        )
    times: dict[str, list[float]] = {k: [] for k in methods}
    try:
        for round_ in range(repeats):  # interleaved: every method once per round, next to the plain copy
            for label, fn in methods.items():
                perturb()
                start = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - start)
            log(f"{name}: round {round_ + 1}/{repeats}")
    finally:
        engine.stop()
        shared.stop()
        if server is not None:
            server.stop()
        if workers is not None:
            workers.shutdown()
    lora_line = lora_payload(path, rank=8)
    base = times["plain copy"]
    print(f"\n### {name} ({size_gb:.2f} GB, {device}, fp32), {repeats} interleaved rounds\n")
    print("| push | median s | range s | ms per MB | x plain copy (median of rounds) | range |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    megabytes = size_gb * 1e9 / 2**20
    for label, values in times.items():
        ratios = sorted(v / b for v, b in zip(values, base))
        print(
            f"| {label} | {statistics.median(values):.4f} | {min(values):.4f}-{max(values):.4f} | "
            f"{1e3 * statistics.median(values) / megabytes:.3f} | "
            f"{statistics.median(ratios):.2f}x | {ratios[0]:.2f}-{ratios[-1]:.2f}x |",
            flush=True,
        )
    if lora_line:
        print(f"\n{lora_line}", flush=True)


def lora_payload(path: str, rank: int) -> str | None:
    """The bytes a LoRA push carries against a full push of the same model (adapters on every
    linear layer but the head, veRL's all-linear)."""
    try:
        from agentgym.model import lora
    except ImportError:
        return None
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        return "LoRA payload: not measured (pip install 'agentgym[lora]')"
    model = lora.wrap(load_causal_lm(path), lora.LoraSettings(rank, 2 * rank, "all-linear"))
    pushed = sum(v.numel() * v.element_size() for v in lora.push_state(model).values())
    full = sum(
        v.numel() * v.element_size()
        for k, v in model.get_base_model().state_dict().items()
        if ".lora_" not in k and k != "lm_head.weight"
    )
    return (
        f"LoRA rank {rank} (all-linear) push: {pushed / 2**20:.1f} MB; full push: {full / 2**20:.1f} MB "
        f"({full / pushed:.0f}x smaller)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", nargs="+", default=None, help="mid qwen05 (default both; --quick: mid)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-server-process", action="store_true", help="in-process rows only")
    parser.add_argument(
        "--ray",
        default=os.environ.get("RAY_ADDRESS"),
        metavar="ADDRESS",
        help="add the Ray object store row on this cluster (auto, host:port; default $RAY_ADDRESS)",
    )
    args = parser.parse_args()
    models = args.models or (["mid"] if args.quick else ["mid", "qwen05"])
    repeats = args.repeats or (3 if args.quick else 5)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"push dir {push_dir()}, load average {os.getloadavg()[0]:.1f}"
    )
    for name in models:
        bench(name, repeats, args.bucket_mb, args.device, not args.no_server_process, args.ray)


if __name__ == "__main__":
    main()
