"""Weights to servers when the actor's rank 0 is on another node: through Ray's object store in buckets
(no shared ``/dev/shm`` or path), and vLLM/SGLang servers given by URL on another host refused before any
work. (The two-node lane, ``test_multinode.py``, runs the same with rank 0 really on another node.)"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentgym.config import ConfigError
from agentgym.model import load_causal_lm, load_tokenizer
from agentgym.server.engine import Engine
from agentgym.server.handles import EmbeddedServerHandle
from agentgym.trainer.config import load_config
from agentgym.trainer.rollout_servers import RolloutServers
from agentgym.trainer.weight_sync import WeightSync, rank0_elsewhere, refuse_unreachable
from agentgym.trainer.worker_group import WorkerGroup
from agentgym.trainer.workers import PolicyWorker


@pytest.fixture(scope="module")
def ray_session():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    if started:
        ray.shutdown()


def test_weights_come_through_the_object_store_in_buckets(ray_session, tmp_path, monkeypatch):
    from agentgym.trainer import weight_sync

    cfg = load_config(
        env="first_letter",
        overrides=[f"trainer.default_local_dir={tmp_path}", "trainer.use_ray=true", "trainer.cpu_threads_per_worker=1"],
    )
    group = WorkerGroup(PolicyWorker, cfg, 1, True)
    handle = EmbeddedServerHandle(Engine(load_causal_lm("tiny"), load_tokenizer("tiny"), max_batch_size=2).start())

    class Servers:  # embedded servers started by this driver
        handles = [handle]
        bucket_mb = 0.05  # several buckets for the tiny model

        def in_process_handles(self):
            return []  # as a Ray trainer sees them

        def loads_state_dicts(self):
            return True

        async def update(self, weights, version, abort=False):
            assert isinstance(weights, dict)
            handle.update_weights(weights, version)

    try:
        group.call("init_model", 2, False)
        assert not rank0_elsewhere(group)  # one node here: the same node as this driver
        refs = group.call("weight_buckets", 0.05)[0]
        assert len(refs) > 1
        monkeypatch.setattr(weight_sync, "rank0_elsewhere", lambda actor: True)  # as on a cluster
        sync = WeightSync(Servers(), group, "tiny")
        assert sync.remote_rank0 and not sync.handles  # no mapping of memory on another host
        with torch.no_grad():  # the actor moves away from what the server holds
            for p in handle.engine.model.parameters():
                p.add_(1.0)
        metrics = asyncio.run(sync.push(3))
        assert metrics["weight_sync/version"] == 3 and handle.engine.weight_version == 3
        trained = group.call("full_state_dict")[0]
        served = handle.engine.model.state_dict()
        assert all(torch.equal(trained[k], served[k]) for k in trained)
    finally:
        handle.stop()
        group.shutdown()


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_engine_servers_given_by_url_on_another_host_are_refused(backend, tmp_path):
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            f"actor_rollout_ref.rollout.name={backend}",
            "actor_rollout_ref.rollout.server_urls=[http://203.0.113.7:8000]",
        ],
    )
    servers = RolloutServers(cfg)
    with pytest.raises(ConfigError, match="file path on its own host.*Run those servers on this host"):
        refuse_unreachable(servers)
    local = RolloutServers(
        load_config(
            env="first_letter",
            overrides=[
                f"actor_rollout_ref.rollout.name={backend}",
                "actor_rollout_ref.rollout.server_urls=[http://127.0.0.1:8000]",
            ],
        )
    )
    refuse_unreachable(local)  # on this host: the file written here is there


@pytest.mark.parametrize("backend", ["embedded", "vllm", "sglang"])
def test_servers_placed_by_ray_listen_on_their_nodes_address(backend, monkeypatch):
    """A vLLM/SGLang server on the rollout pool bound 127.0.0.1 (only embedded ones took the node's
    address): unreachable from a driver on another node."""
    import ray

    from agentgym.server import launch
    from agentgym.trainer.resource_pools import PolicyServerActor

    started = []
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.1.2.3")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"get_node_id": lambda self: "n2"})())
    monkeypatch.setattr(launch, "start_policy_server", lambda b, m, port, **kw: started.append((b, kw)) or object())
    PolicyServerActor(backend, "tiny", {"max_model_len": 64})
    assert started == [(backend, {"max_model_len": 64, "host": "10.1.2.3"})]


def test_agentgym_train_refuses_them_before_the_warm_start(tmp_path, monkeypatch):
    """The refusal came when RL's weight sync started: after the warm start's demos, its SFT and the start
    model's held-out scores (minutes with the sokoban preset). Now ``prepare_training`` refuses, before any stage."""
    from agentgym.stages.train_command import prepare_training
    from agentgym.trainer import rollout_servers
    from tests.support.sglang_standin import SGLangStandin

    standin = SGLangStandin(model_path="tiny", served_model_name="tiny")
    url = standin.start()  # answers, so the preflight's reachability check passes
    monkeypatch.setattr(rollout_servers, "is_local_url", lambda u: u != url)  # it runs on another host
    overrides = [
        f"trainer.default_local_dir={tmp_path}",
        "actor_rollout_ref.rollout.name=sglang",
        f"actor_rollout_ref.rollout.server_urls=[{url}]",
    ]
    try:
        with pytest.raises(ConfigError, match="on another host.*Run those servers on this host"):
            prepare_training("sokoban", None, None, overrides)
    finally:
        standin.stop()
    assert not (tmp_path / "warm_start").exists()
