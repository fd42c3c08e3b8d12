"""Asynchronous training scaled out: a two-node Ray cluster started on this machine (``ray start --head``
plus ``ray start --address ...``, each node with its own custom resource), the trainer pool on one
node and the rollout pool (policy servers) on the other, weights pushed across in buckets; and a
gateway process feeding a named DataPool on that cluster."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentgym.model.weights import buckets

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")


def test_buckets_hold_at_most_the_buffer_size():
    import torch

    state = {f"w{i}": torch.zeros(2**18) for i in range(5)}  # 1 MB each
    state["big"] = torch.zeros(3 * 2**18)  # 3 MB: alone
    parts = buckets(state, 2)
    assert [sorted(p) for p in parts] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["big"]]
    assert sum(len(p) for p in parts) == len(state)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(tag: str) -> None:
    """End the processes of this cluster only: those whose command line names its temp dir."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                if pid != os.getpid() and tag in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, sig)
            except (OSError, ProcessLookupError):
                pass
        time.sleep(1.0)


@pytest.fixture(scope="module")
def two_nodes():
    if not RAY.exists():
        pytest.skip("the ray command is not installed")
    temp = tempfile.mkdtemp(prefix="agentgym-2nodes-", dir="/tmp")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    common = ["--num-cpus", "2", "--disable-usage-stats"]
    try:
        subprocess.run(
            [
                str(RAY),
                "start",
                "--head",
                "--port",
                str(port),
                "--temp-dir",
                temp,
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(_free_port()),
                "--resources",
                json.dumps({"agentgym_trainer_pool": 1}),
                *common,
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [
                str(RAY),
                "start",
                "--address",
                f"127.0.0.1:{port}",
                "--resources",
                json.dumps({"agentgym_rollout_pool": 1}),
                *common,
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield f"127.0.0.1:{port}"
    finally:
        _stop(temp)
        shutil.rmtree(temp, ignore_errors=True)


def _node_with(address: str, resource: str) -> str:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource))
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_trainer_and_rollout_pools_on_their_own_nodes(two_nodes, tmp_path):
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    trainer_node = _node_with(two_nodes, "agentgym_trainer_pool")
    rollout_node = _node_with(two_nodes, "agentgym_rollout_pool")
    cfg = load_config(
        env="first_letter",
        config_name="async_ppo_trainer",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "trainer.use_ray=true",
            "trainer.total_training_steps=3",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.val_before_train=false",
            "trainer.save_hf_model=false",
            f"ray_init.address={two_nodes}",
            "async_training.trigger_parameter_sync_step=1",
            "async_training.checkpoint_engine.device_buffer_size_M=1",
            "async_training.partial_rollout=true",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
        ],
    )
    summary = train(cfg, show_progress=False)
    assert summary["steps"] == 3
    assert summary["placement"] == {"trainer": [trainer_node], "rollout": [rollout_node]}
    rows = [json.loads(line) for line in Path(summary["metrics_file"]).read_text().splitlines()]
    assert [r["async/servers_version"] for r in rows] == [0, 1, 2]  # pushed across every update
    pushed = [r for r in rows if "weight_sync/buckets_previous" in r or "weight_sync/buckets" in r]
    assert pushed and all(r.get("weight_sync/buckets_previous", r.get("weight_sync/buckets")) >= 1 for r in pushed)


@pytest.mark.slow
def test_a_gateway_process_feeds_a_named_data_pool(two_nodes, tmp_path, embedded_server):
    import ray

    from agentgym.gateway.client import GatewayClient
    from agentgym.rollout.data_pool import create_pool_actor

    ray.init(address=two_nodes, namespace="agentgym-test", logging_level="ERROR", log_to_driver=False)
    server = embedded_server
    gateway = None
    try:
        pool = create_pool_actor("feed-test-pool", namespace="agentgym-test", group_size=2)
        port = _free_port()
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "gateway",
                "--server",
                server.url,
                "--port",
                str(port),
                "--data-pool-name",
                "feed-test-pool",
                "--ray-address",
                two_nodes,
                "--ray-namespace",
                "agentgym-test",
                "--prompt-length",
                "256",
                "--response-length",
                "128",
                "--admin-key",
                "feed-test-key",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"

        async def sessions() -> None:
            import httpx

            client = GatewayClient(url, admin_key="feed-test-key")
            deadline = time.monotonic() + 120
            while True:  # the gateway joins Ray and finds the pool before it listens
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert gateway.poll() is None and time.monotonic() < deadline, gateway.stdout.read().decode()[-2000:]
                await asyncio.sleep(0.2)
            for _ in range(2):
                info = await client.create_session(task={"question": "hi"}, group_id="g", sampling={"max_tokens": 8})
                async with httpx.AsyncClient() as http:
                    response = await http.post(
                        info["base_url"] + "/chat/completions",
                        json={"model": "tiny", "messages": [{"role": "user", "content": "say hi"}]},
                        headers={"Authorization": f"Bearer {info['api_key']}"},
                    )
                    assert response.status_code == 200, response.text
                await client.finish_session(info["id"], reward=1.0)
            await client.aclose()

        asyncio.run(sessions())
        assert ray.get(pool.ready.remote()) == ["g"]  # both sessions arrived: the group is complete
        ((info, trajectories),) = ray.get(pool.take.remote(["g"]))
        assert len(trajectories) == 2 and all(t.outcome_reward == 1.0 and t.turns for t in trajectories)
    finally:
        if gateway is not None:
            os.killpg(gateway.pid, signal.SIGTERM)
            gateway.wait(30)
        ray.shutdown()
