"""A real two-node Ray cluster on this machine, each "host" with its own ``/dev/shm``, run the way a
cluster user runs ``agentgym train``.

The cluster lives in a network namespace whose only interface is ``lo`` (``unshare -n``: Ray rewrites
``--node-ip-address=127.0.0.1`` to the host's interface address otherwise) and a private mount
namespace with its own tmpfs ``/dev/shm`` (the head). Nodes 2 and 3 are each started from a nested
mount namespace with another tmpfs ``/dev/shm`` and a tmpfs over its "local disk" (``LOCAL``), and
offer ``agentgym_trainer_pool``: the trainer's ranks run there, never on the driver's node. The run directory
is shared (the test's ``tmp_path``) unless a scenario says otherwise.

Scenarios, in one cluster (a script, ``SCRIPT``): synchronous training of sokoban with rank 0 on node 2
after the warm start (demos, SFT on the cluster; RL's rank 0 loads the SFT model from the shared run
directory), weights through the object store, checkpoints, the HF export and the held-out table in the
shared run directory, the same with a run directory node 2 does not share (refused before any step), resume of
the first run with another placement (the workers in the driver's process), the driver joining
through ``RAY_ADDRESS`` (as under ``ray job submit``) with ``ray_init.num_cpus`` set, and
``trainer.nnodes=2`` on CPU: one rank on each trainer node (a placement group), gloo across them.
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
BIN = Path(sys.executable).parent

SCRIPT = r"""
set -u
ip link set lo up
mount -t tmpfs tmpfs /dev/shm
export RAY_AUTH_MODE=disabled PYTHONPATH="$ROOT" PATH="$BIN:$PATH" TOKENIZERS_PARALLELISM=false
ray start --head --node-ip-address 127.0.0.1 --port 6379 --num-cpus 2 --temp-dir "$TEMP" \
    --include-dashboard false --disable-usage-stats > "$OUT/head.log" 2>&1 || { echo HEAD_FAILED; exit 3; }
unshare -m --propagation private sh -c "mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs '$LOCAL' && \
    ray start --address 127.0.0.1:6379 --node-ip-address 127.0.0.1 --num-cpus 2 \
    --resources '{\"agentgym_trainer_pool\": 1}' --disable-usage-stats" > "$OUT/node2.log" 2>&1 \
    || { echo NODE2_FAILED; exit 3; }
unshare -m --propagation private sh -c "mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs '$LOCAL' && \
    ray start --address 127.0.0.1:6379 --node-ip-address 127.0.0.1 --num-cpus 2 \
    --resources '{\"agentgym_trainer_pool\": 1}' --disable-usage-stats" > "$OUT/node3.log" 2>&1 \
    || { echo NODE3_FAILED; exit 3; }
COMMON="data.train_batch_size=2 actor_rollout_ref.rollout.n=2 trainer.logger=[jsonl] \
    trainer.test_freq=-1 trainer.val_before_train=false trainer.cpu_threads_per_worker=1 \
    actor_rollout_ref.rollout.max_tokens_per_turn=16 held_out.num_tasks=4 held_out.temperatures=[0.0] \
    held_out.random_policy=false warm_start.demos=40 warm_start.sft.trainer.total_training_steps=3 \
    warm_start.sft.data.train_batch_size=8 warm_start.sft.data.micro_batch_size_per_gpu=8"
# 1. rank 0 on node 2, run directory shared; joined through RAY_ADDRESS with num_cpus given (ray job submit);
#    the warm start's SFT on the cluster too, its model loaded by rank 0 on node 2
RAY_ADDRESS=127.0.0.1:6379 agentgym train --env sokoban $COMMON trainer.use_ray=true ray_init.num_cpus=2 \
    warm_start.sft.trainer.use_ray=true trainer.total_training_steps=2 trainer.save_freq=1 \
    trainer.default_local_dir="$SHARED" > "$OUT/sync.log" 2>&1
echo "SYNC_RC=$?"
# 2. a run directory node 2 does not see: refused before any stage (the warm start's demos and SFT included)
agentgym train --env sokoban $COMMON trainer.use_ray=true ray_init.address=auto \
    trainer.total_training_steps=1 trainer.default_local_dir="$LOCAL/run" > "$OUT/local.log" 2>&1
echo "LOCAL_RC=$?"
# 3. resume the first run with another placement: the workers in the driver's process, on the head
agentgym train --env sokoban $COMMON trainer.use_ray=false warm_start.sft.trainer.use_ray=true \
    trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$SHARED" > "$OUT/resume.log" 2>&1
echo "RESUME_RC=$?"
# 4. trainer.nnodes=2: one rank on each trainer node (placement group, STRICT_SPREAD), gloo across them
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
echo "SPREAD_RC=$?"
grep '^SPREAD ' "$OUT/spread.log" || true
"""


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
def test_two_nodes_rank0_elsewhere_shared_storage_resume_elsewhere(tmp_path):
    temp = Path(f"/tmp/agentgym-mn-{os.getpid()}")  # short: Ray's socket paths live under it
    shared, local, out = tmp_path / "run", tmp_path / "node2-local", tmp_path / "out"
    local.mkdir()
    out.mkdir()
    env = {
        **os.environ,
        "ROOT": str(ROOT),
        "BIN": str(BIN),
        "TEMP": str(temp),
        "SHARED": str(shared),
        "LOCAL": str(local),
        "OUT": str(out),
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
    logs = {p.name: p.read_text()[-3000:] for p in out.glob("*.log")}
    report = done.stdout + done.stderr + "\n".join(f"--- {k}\n{v}" for k, v in logs.items())
    assert "SYNC_RC=0" in done.stdout, report
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
    # a run directory node 2 has its own disk at: refused before any step, with the way out
    assert "LOCAL_RC=2" in done.stdout, report
    assert "not shared with every node" in logs["local.log"], report
    assert not (local / "run" / "global_step_1").exists()
    assert "warm start:" not in logs["local.log"] and not (local / "run" / "warm_start").exists(), report
    # resumed on the driver's node from what node 2 saved
    assert "RESUME_RC=0" in done.stdout, report
    assert (shared / "global_step_3" / "manifest.json").is_file(), report
    assert "resuming from" in logs["resume.log"] and [r["step"] for r in rows][-1] == 3, report
    # trainer.nnodes=2: the two ranks on two different nodes, neither the driver's
    assert "SPREAD_RC=0" in done.stdout, report
    spread = json.loads(done.stdout.split("SPREAD ", 1)[1].splitlines()[0])
    assert spread["steps"] == 1 and len(set(spread["ranks"])) == 2 and spread["head"] not in spread["ranks"], spread
