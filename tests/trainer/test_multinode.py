"""A real three-node Ray cluster on this machine, each "host" with its own ``/dev/shm``, run the way a
cluster user runs ``agentgym train``.

The cluster lives in a network namespace whose only interface is ``lo`` (``unshare -n``: Ray rewrites
``--node-ip-address=127.0.0.1`` to the host's interface address otherwise) and a private mount
namespace with its own tmpfs ``/dev/shm`` (the head, with Ray's job server). Nodes 2 and 3 are each
started from a nested mount namespace with another tmpfs ``/dev/shm`` and a tmpfs over its "local disk"
(``LOCAL``), and offer ``agentgym_trainer_pool`` (node 3 ``agentgym_rollout_pool`` too): the trainer's
ranks run there, never on the driver's node. The run directory is shared (the test's ``tmp_path``)
unless a scenario says otherwise.

Scenarios, in one cluster (a script, ``SCRIPT``): synchronous training of sokoban submitted with ``ray job
submit`` (its driver on the head, ``RAY_ADDRESS`` set by Ray, ``ray_init.num_cpus`` given) with rank 0 on
another node after the warm start (demos, SFT on the cluster; RL's rank 0 loads the SFT model from the
shared run directory), weights through the object store, checkpoints, the HF export and the held-out
table in the shared run directory; a Ray job with a relative run directory (refused, the job's failure
is ``ray job submit``'s exit status); a run directory node 2 does not share (refused before any step);
resume of the first run with another placement (the workers in the driver's process);
``trainer.nnodes=2`` on CPU: one rank on each trainer node (a placement group), gloo across them; and
asynchronous training with ``rollout.name=vllm``: the vLLM stand-in (``tests/support/vllm_api_server``:
agentgym's server behind vLLM's command line and weight routes) on the rollout pool's node, loading each
push from its own ``/dev/shm`` through agentgym's vLLM worker extension.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "support" / "vllm_api_server"  # `vllm` there: tests/support/vllm_api_server/vllm/...
BIN = Path(sys.executable).parent

SCRIPT = r"""
set -u
ip link set lo up
mount -t tmpfs tmpfs /dev/shm
# RAY_TMPDIR: `ray start` records the cluster's address under it, where address=auto looks first (else auto
# takes any Ray GCS process it sees: on a shared machine, maybe another cluster's, outside this network namespace)
export RAY_AUTH_MODE=disabled PYTHONPATH="$ROOT" PATH="$BIN:$PATH" TOKENIZERS_PARALLELISM=false RAY_TMPDIR="$TEMP"
# rollout.name=vllm runs the vLLM stand-in (tests/support/vllm_api_server) wherever Ray puts the server
export AGENTGYM_VLLM_PYTHON="$VLLM_PYTHON" AGENTGYM_VLLM_STANDIN_RECORD="$OUT/vllm-loads"
ray start --head --node-ip-address 127.0.0.1 --port 6379 --num-cpus 2 --temp-dir "$TEMP/ray" \
    --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port 8265 --disable-usage-stats \
    > "$OUT/head.log" 2>&1 || { echo HEAD_FAILED; exit 3; }
unshare -m --propagation private sh -c "mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs '$LOCAL' && \
    ray start --address 127.0.0.1:6379 --node-ip-address 127.0.0.1 --num-cpus 2 \
    --resources '{\"agentgym_trainer_pool\": 1}' --disable-usage-stats" > "$OUT/node2.log" 2>&1 \
    || { echo NODE2_FAILED; exit 3; }
unshare -m --propagation private sh -c "mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs '$LOCAL' && \
    ray start --address 127.0.0.1:6379 --node-ip-address 127.0.0.1 --num-cpus 2 \
    --resources '{\"agentgym_trainer_pool\": 1, \"agentgym_rollout_pool\": 1}' --disable-usage-stats" \
    > "$OUT/node3.log" 2>&1 || { echo NODE3_FAILED; exit 3; }
COMMON="data.train_batch_size=2 actor_rollout_ref.rollout.n=2 trainer.logger=[jsonl] \
    trainer.test_freq=-1 trainer.val_before_train=false trainer.cpu_threads_per_worker=1 \
    actor_rollout_ref.rollout.max_tokens_per_turn=16 held_out.num_tasks=4 held_out.temperatures=[0.0] \
    held_out.random_policy=false warm_start.demos=40 warm_start.sft.trainer.total_training_steps=3 \
    warm_start.sft.data.train_batch_size=8 warm_start.sft.data.micro_batch_size_per_gpu=8"
JOB="ray job submit --address http://127.0.0.1:8265 --"
# 1. submitted as a Ray job (its driver on the head; Ray sets RAY_ADDRESS for it), ray_init.num_cpus given
#    (not passed when joining); rank 0 on node 2 or 3, run directory shared; the warm start's SFT on the
#    cluster too, its model loaded by rank 0 on another node
$JOB agentgym train --env sokoban $COMMON trainer.use_ray=true ray_init.num_cpus=2 \
    warm_start.sft.trainer.use_ray=true trainer.total_training_steps=2 trainer.save_freq=1 \
    trainer.default_local_dir="$SHARED" > "$OUT/sync.log" 2>&1
echo "SYNC_RC=$? at ${SECONDS}s"
# 2. a Ray job with a relative run directory (it would land where `ray start` ran on the head): refused
$JOB agentgym train --env first_letter trainer.use_ray=true trainer.default_local_dir=runs/relative \
    > "$OUT/job-relative.log" 2>&1
echo "RELATIVE_RC=$? at ${SECONDS}s"
# 3. a run directory node 2 does not see: refused before any stage (the warm start's demos and SFT included)
agentgym train --env sokoban $COMMON trainer.use_ray=true ray_init.address=auto \
    trainer.total_training_steps=1 trainer.default_local_dir="$LOCAL/run" > "$OUT/local.log" 2>&1
echo "LOCAL_RC=$? at ${SECONDS}s"
# 4. resume the first run with another placement: the workers in the driver's process, on the head
agentgym train --env sokoban $COMMON trainer.use_ray=false warm_start.sft.trainer.use_ray=true \
    trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$SHARED" > "$OUT/resume.log" 2>&1
echo "RESUME_RC=$? at ${SECONDS}s"
# 5. trainer.nnodes=2: one rank on each trainer node (placement group, STRICT_SPREAD), gloo across them
RAY_ADDRESS=auto python -c "
import json, agentgym
s = agentgym.train('first_letter', ['trainer.use_ray=true', 'trainer.nnodes=2', 'trainer.n_gpus_per_node=1',
    'trainer.total_training_steps=1', 'trainer.save_freq=-1', 'trainer.save_hf_model=false',
    'trainer.val_before_train=false', 'trainer.test_freq=-1', 'trainer.logger=[jsonl]', 'data.train_batch_size=2',
    'actor_rollout_ref.rollout.n=2', 'trainer.cpu_threads_per_worker=1', 'trainer.default_local_dir=$SHARED-2'],
    show_progress=False)
import ray; ray.init(address='auto', logging_level='ERROR')
head = ray.get_runtime_context().get_node_id()
print('SPREAD', json.dumps({'ranks': s['placement']['trainer'], 'head': head, 'steps': s['steps']}))
" > "$OUT/spread.log" 2>&1
echo "SPREAD_RC=$? at ${SECONDS}s"
grep '^SPREAD ' "$OUT/spread.log" || true
# 6. asynchronous, rollout.name=vllm: the server (the vLLM stand-in) on node 3, the rollout pool's; the
#    weights reach it through the object store, then vLLM's /collective_rpc from node 3's own /dev/shm
RAY_ADDRESS=127.0.0.1:6379 python -c "
import json, agentgym
s = agentgym.train('first_letter', ['trainer.use_ray=true', 'actor_rollout_ref.rollout.name=vllm',
    'trainer.total_training_steps=2', 'trainer.save_freq=-1', 'trainer.save_hf_model=false',
    'trainer.val_before_train=false', 'trainer.test_freq=-1', 'trainer.logger=[jsonl]', 'data.train_batch_size=2',
    'actor_rollout_ref.rollout.n=2', 'trainer.cpu_threads_per_worker=1', 'async_training.trigger_parameter_sync_step=1',
    'trainer.default_local_dir=$SHARED-vllm'], asynchronous=True, show_progress=False)
import ray; ray.init(address='127.0.0.1:6379', logging_level='ERROR')
pool = [n['NodeID'] for n in ray.nodes() if n['Alive'] and n['Resources'].get('agentgym_rollout_pool')]
print('VLLM', json.dumps({'placement': s['placement'], 'pool': pool, 'steps': s['steps']}))
" > "$OUT/vllm.log" 2>&1
echo "VLLM_RC=$? at ${SECONDS}s"
grep '^VLLM ' "$OUT/vllm.log" || true
"""


def _jobs_ok() -> bool:
    """``ray job submit`` needs Ray's job server, in the dashboard: ``pip install "ray[default]"``."""
    try:
        from ray._private.utils import get_dashboard_dependency_error
    except ImportError:
        return False
    return get_dashboard_dependency_error() is None


def _namespaces_ok() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip") or not (BIN / "ray").exists():
        return False
    probe = subprocess.run(
        ["unshare", "-n", "-m", "--propagation", "private", "sh", "-c", "ip link set lo up && mount -t tmpfs t /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


def _stop(tag: str) -> None:
    """End this cluster's processes only: those whose command line names its temp dir."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                if pid != os.getpid() and tag in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, sig)
            except (OSError, ProcessLookupError):
                pass
        time.sleep(1.0)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.multinode
@pytest.mark.slow
@pytest.mark.skipif(not _namespaces_ok(), reason="needs root with unshare -n/-m, ip and the ray command")
@pytest.mark.skipif(not _jobs_ok(), reason='ray job submit needs pip install "ray[default]" (agentgym[cluster])')
def test_two_nodes_rank0_elsewhere_shared_storage_resume_elsewhere(tmp_path):
    temp = Path(f"/tmp/agentgym-mn-{os.getpid()}")  # short: Ray's socket paths live under it
    shared, local, out = tmp_path / "run", tmp_path / "node2-local", tmp_path / "out"
    local.mkdir()
    out.mkdir()
    vllm_python = tmp_path / "vllm-python"  # an interpreter that imports the stand-in as `vllm`
    vllm_python.write_text(
        f'#!/bin/sh\nPYTHONPATH="{STANDIN}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n'
    )
    vllm_python.chmod(0o755)
    env = {
        **os.environ,
        "ROOT": str(ROOT),
        "BIN": str(BIN),
        "TEMP": str(temp),
        "SHARED": str(shared),
        "LOCAL": str(local),
        "OUT": str(out),
        "VLLM_PYTHON": str(vllm_python),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run(
            ["unshare", "-n", "-m", "--propagation", "private", "bash", "-c", SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        _stop(str(temp))
        shutil.rmtree(temp, ignore_errors=True)
    logs = {p.name: p.read_text() for p in out.glob("*.log")}
    report = done.stdout + done.stderr + "\n".join(f"--- {k}\n{v[-3000:]}" for k, v in logs.items())
    # submitted as a Ray job: it ran to the end, and `ray job submit` says so with its exit status
    assert "SYNC_RC=0 at " in done.stdout and "succeeded" in logs["sync.log"], report
    # rank 0 was on node 2: every push came through the object store, and the servers moved with it
    rows = _rows(shared / "metrics.jsonl") if (shared / "metrics.jsonl").exists() else []
    assert rows, report
    pushed = [r for r in rows if "weight_sync/version" in r and r["step"] <= 2]  # steps 1-2: the first run
    assert len(pushed) == 2 and all(r.get("weight_sync/object_store") == 1.0 for r in pushed), rows
    # one checkpoint, sealed by the driver with the files node 2 wrote
    manifest = json.loads((shared / "global_step_2" / "manifest.json").read_text())["files"]
    assert {"actor/model.pt", "actor/optim.pt", "trainer_state.pt"} <= set(manifest), manifest
    assert (shared / "huggingface" / "config.json").is_file()  # written by rank 0 on node 2
    assert (shared / "held_out.json").is_file(), report  # scored here from node 2's export
    assert (shared / "warm_start" / "sft" / "huggingface" / "config.json").is_file(), report
    assert "warm start: RL starts from the SFT model" in logs["sync.log"], report
    # a Ray job with a relative run directory: refused with the way out, and the job's failure is ray job
    # submit's exit status
    assert "RELATIVE_RC=1 at " in done.stdout, report
    assert "is relative, and this driver runs as a Ray job" in logs["job-relative.log"], report
    assert "trainer.default_local_dir=/shared/runs/NAME" in logs["job-relative.log"], report
    assert "failed with exit code 2" in logs["job-relative.log"], report
    # a run directory node 2 has its own disk at: refused before any step, with the way out
    assert "LOCAL_RC=2 at " in done.stdout, report
    assert "not shared with every node" in logs["local.log"], report
    assert not (local / "run" / "global_step_1").exists()
    assert "warm start:" not in logs["local.log"] and not (local / "run" / "warm_start").exists(), report
    # resumed on the driver's node from what node 2 saved
    assert "RESUME_RC=0 at " in done.stdout, report
    assert (shared / "global_step_3" / "manifest.json").is_file(), report
    assert "resuming from" in logs["resume.log"] and [r["step"] for r in rows][-1] == 3, report
    # trainer.nnodes=2: the two ranks on two different nodes, neither the driver's
    assert "SPREAD_RC=0 at " in done.stdout, report
    spread = json.loads(done.stdout.split("SPREAD ", 1)[1].splitlines()[0])
    assert spread["steps"] == 1 and len(set(spread["ranks"])) == 2 and spread["head"] not in spread["ranks"], spread
    # asynchronous with rollout.name=vllm: the stand-in on the rollout pool's node loaded every push from
    # its own /dev/shm (the weights came through the object store), through agentgym's worker extension
    assert "VLLM_RC=0 at " in done.stdout, report
    vllm = json.loads(done.stdout.split("VLLM ", 1)[1].splitlines()[0])
    assert vllm["steps"] == 2 and vllm["placement"]["rollout"] == vllm["pool"] and len(vllm["pool"]) == 1, vllm
    rows = _rows(Path(f"{shared}-vllm") / "metrics.jsonl")
    assert [r["async/servers_version"] for r in rows] == [0, 1], rows
    loads = [json.loads(line) for f in (out / "vllm-loads").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(loads) == 2, loads  # one push per update (trigger_parameter_sync_step=1), the last at the end
    assert all(x["path"].startswith("/dev/shm/") and x["tensors"] > 0 for x in loads), loads
