"""Joining a Ray cluster the way Ray users do: ``RAY_ADDRESS`` (what ``ray job submit`` sets for its
entrypoint), ``ray_init.address=auto|host:port``; no resources are passed when joining (Ray refuses
them), and ``agentgym sft`` and the warm start's SFT honour ``ray_init`` too."""

from __future__ import annotations

import logging
import shutil
import tempfile

import pytest
from omegaconf import OmegaConf

from agentgym.trainer import worker_group


@pytest.fixture
def ray_init_calls(monkeypatch):
    """What ``init_ray`` passes to ``ray.init`` (Ray itself is not started)."""
    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def _cfg(**ray_init):
    return OmegaConf.create({"ray_init": {"address": None, "num_cpus": None, "include_dashboard": False, **ray_init}})


def test_ray_address_from_the_environment_joins_without_resources(ray_init_calls, monkeypatch, caplog):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # ray job submit sets this for the entrypoint
    with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
        worker_group.init_ray(_cfg(num_cpus=2))
    (call,) = ray_init_calls
    assert call["address"] == "10.0.0.5:6379"
    assert not {"num_cpus", "num_gpus", "include_dashboard"} & set(call)
    assert "num_cpus=2" in caplog.text and "not passed" in caplog.text  # said, not silently dropped


@pytest.mark.parametrize("address", ["auto", "head:6379"])
def test_ray_init_address_joins_and_wins_over_the_environment(ray_init_calls, monkeypatch, address):
    monkeypatch.setenv("RAY_ADDRESS", "elsewhere:1")
    worker_group.init_ray(_cfg(address=address))
    assert ray_init_calls == [{"address": address, "logging_level": logging.WARNING, "log_to_driver": True}]


@pytest.mark.parametrize("address", [None, "local"])
def test_no_address_starts_a_local_cluster_sized_here(ray_init_calls, address):
    worker_group.init_ray(_cfg(address=address, num_cpus=3))
    (call,) = ray_init_calls
    assert "address" not in call and call["num_cpus"] == 3


def test_sft_config_has_ray_init_and_the_warm_start_passes_it_on(tmp_path):
    from agentgym.stages.sft import load_sft_config
    from agentgym.stages.warm_start import sft_config
    from agentgym.trainer.config import load_config

    assert load_sft_config(overrides=["ray_init.address=auto", "data.train_files=x.jsonl"]).ray_init.address == "auto"
    train = load_config(
        env="first_letter", overrides=[f"trainer.default_local_dir={tmp_path}", "ray_init.address=head:6379"]
    )
    demos = tmp_path / "demos.jsonl"
    demos.write_text("")
    assert sft_config(train, demos, "m").ray_init.address == "head:6379"
    train.warm_start.sft = {"ray_init": {"address": "other:1"}}  # warm_start.sft's own setting wins
    assert sft_config(train, demos, "m").ray_init.address == "other:1"


def test_sft_trainer_joins_the_configured_cluster(ray_init_calls, monkeypatch, tmp_path):
    """``agentgym sft trainer.use_ray=true ray_init.address=...`` attaches there (it passed None before)."""
    from agentgym.stages import sft

    seen: list = []

    class Group:  # the worker group is not what is tested here: where Ray was pointed is
        use_ray = False  # (no Ray workers to check the run directory with)

        def __init__(self, *args, **kwargs):
            seen.append(args[3])

        def call(self, *args, **kwargs):
            return [None]

    monkeypatch.setattr(worker_group, "WorkerGroup", Group)
    trainer = sft.SFTTrainer.__new__(sft.SFTTrainer)
    trainer.cfg = sft.load_sft_config(
        overrides=["trainer.use_ray=true", "ray_init.address=head:6379", "data.train_files=x.jsonl"]
    )
    trainer.world_size, trainer.total_steps, trainer.run_dir = 1, 1, tmp_path
    trainer.init_workers()
    assert ray_init_calls[0]["address"] == "head:6379" and seen == [True]
    assert trainer.started_ray is True


@pytest.mark.parametrize(
    ("nnodes", "per_node", "configured", "expected"),
    [
        (1, 4, "auto", "STRICT_PACK"),
        (2, 1, "auto", "STRICT_SPREAD"),  # one worker on each node (PACK put both on one)
        (2, 4, "auto", "PACK"),
        (2, 1, "SPREAD", "SPREAD"),
    ],
)
def test_the_trainer_pools_placement_strategy(nnodes, per_node, configured, expected):
    from agentgym.trainer.resource_pools import pool_strategy

    assert pool_strategy(nnodes, per_node, configured) == expected


def test_a_multi_node_cpu_trainer_pool_gets_a_placement_group(monkeypatch, tmp_path):
    """On CPU, ``trainer.nnodes=2`` used to only set the world size: both workers could land on one node."""
    from agentgym.trainer import resource_pools
    from agentgym.trainer.config import load_config
    from agentgym.trainer.ppo_trainer import PPOTrainer

    asked = []
    monkeypatch.setattr(resource_pools, "cluster_offers", lambda resource: False)
    monkeypatch.setattr(resource_pools, "pool_placement_group", lambda *a, **k: asked.append((a, k)) or "pg")
    monkeypatch.setattr(worker_group, "init_ray", lambda cfg: None)
    for nnodes, expected in ((1, None), (2, "pg")):
        cfg = load_config(
            env="first_letter",
            overrides=[f"trainer.default_local_dir={tmp_path}", f"trainer.nnodes={nnodes}", "trainer.use_ray=true"],
        )
        trainer = PPOTrainer.__new__(PPOTrainer)
        trainer.cfg, trainer.use_ray, trainer.world_size = cfg, True, nnodes
        assert trainer.worker_bundles(0.0) == expected
    assert asked == [(("trainer", 2, 1, False), {"strategy": "auto"})]


@pytest.fixture
def auth_mode_seen(monkeypatch):
    """``RAY_AUTH_MODE`` as ``ray.init`` sees it, after ``agentgym train`` set its default (the user set none)."""
    import os

    import ray

    seen: list = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(os.environ.get("RAY_AUTH_MODE")))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(worker_group, "_auth_defaulted", False)
    return seen


@pytest.mark.parametrize(("address", "expected"), [(None, "disabled"), ("auto", None), ("head:6379", None)])
def test_joining_a_cluster_leaves_its_authentication_to_ray(auth_mode_seen, address, expected):
    """A cluster agentgym starts has no token auth; one it joins is joined as ``ray.init(address=...)`` joins it:
    ``ray start --head`` turns token auth on where ``~/.ray/auth_token`` exists, and ``ray.init(address="auto")``
    then finds the token. agentgym's ``RAY_AUTH_MODE=disabled`` made that join fail (InvalidAuthToken)."""
    worker_group.default_ray_auth()  # what agentgym train / sft / agentgym.train() do first
    worker_group.init_ray(_cfg(address=address))
    assert auth_mode_seen == [expected]


def test_a_mode_the_user_set_is_kept_when_joining(auth_mode_seen, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    worker_group.default_ray_auth()
    worker_group.init_ray(_cfg(address="head:6379"))
    assert auth_mode_seen == ["token"]


def _namespaces_allowed() -> bool:
    import shutil
    import subprocess

    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-n", "-m", "-p", "--fork", "true"], capture_output=True).returncode == 0


@pytest.mark.multinode
def test_agentgym_joins_a_token_auth_cluster_with_address_auto():
    """A real head started the way Ray users start one, where a token exists (``ray start --head`` then enables
    token auth), joined from its node by agentgym's ``init_ray`` with ``ray_init.address=auto`` and no
    ``RAY_AUTH_MODE`` set: in its own network, mount and PID namespaces (only ``lo``, a private ``/tmp``), so
    ``auto`` finds this cluster and no other, and ``ray stop`` stops this one only."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not _namespaces_allowed():
        pytest.skip("needs root and unshare (network, mount and PID namespaces)")
    root = Path(__file__).resolve().parents[2]
    ray_bin = Path(sys.executable).parent / "ray"
    join = (
        "from omegaconf import OmegaConf; import ray; from agentgym.trainer.worker_group import default_ray_auth, "
        "init_ray; default_ray_auth(); init_ray(OmegaConf.create({'ray_init': {'address': 'auto', 'num_cpus': None, "
        "'include_dashboard': False}})); print('joined', len(ray.nodes()))"
    )
    # its own temp dir (not a tmpfs over /tmp, which would hide a checkout or venv that lives under /tmp); a short
    # path, as Ray's socket paths under it must fit a Unix socket's 107 characters
    scratch = tempfile.mkdtemp(prefix="agj-")
    script = (
        f"set -e; ip link set lo up; export HOME={scratch}/home RAY_TMPDIR={scratch}/ray; mkdir -p $HOME/.ray; "
        "printf %064d 0 > $HOME/.ray/auth_token; "  # a token exists, as after any local ray.init()
        f"{ray_bin} start --head --port 6379 --node-ip-address 127.0.0.1 --num-cpus 1 --include-dashboard false "
        f"--temp-dir {scratch}/ray --disable-usage-stats >/dev/null 2>&1; "
        f'set +e; timeout 60 {sys.executable} -c "{join}"; rc=$?; {ray_bin} stop --force >/dev/null 2>&1; exit $rc'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(root))
    out = subprocess.run(
        # its own PID namespace too: `ray stop` there sees this head only, not other Ray processes on the machine
        ["unshare", "-n", "-m", "-p", "--fork", "--mount-proc", "--propagation", "private", "bash", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    shutil.rmtree(scratch, ignore_errors=True)
    assert out.returncode == 0 and "joined 1" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]


def test_a_cluster_that_cannot_be_joined_is_named_with_the_way_out(monkeypatch):
    """Ray's own error names the address only; a token-auth cluster joined without the token fails the same way
    after a minute of InvalidAuthToken lines."""
    import ray

    def refuse(**kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(worker_group.ClusterUnreachable, match="head:6379.*ray start --head.*RAY_AUTH_MODE=token"):
        worker_group.init_ray(_cfg(address="head:6379"))
