"""Nothing left behind in ``/dev/shm``: a worker's shared weights (``torch_<pid>_*``, the whole model)
are unlinked at its shutdown, and the orphan sweep removes those of a worker killed together with
torch's manager process (what Ray does to a worker's children)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_policy_worker_unlinks_its_shared_weights_at_shutdown(tmp_path):
    from tests.model.test_lora import policy_worker

    worker = policy_worker(tmp_path)
    handles = worker.weight_handles()
    files = {Path("/dev/shm") / h["handle"].lstrip("/") for h in handles.values()}
    assert files and all(f.exists() and f.name.startswith(f"torch_{os.getpid()}_") for f in files)
    worker.shutdown()
    assert not [f for f in files if f.exists()]


def _unshare_ok() -> bool:
    if not shutil.which("unshare") or not Path("/dev/shm").is_dir():
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


SCENARIO = """
import os, subprocess, sys, time
from pathlib import Path
import psutil
from agentgym.trainer.weight_sync import remove_orphans

child = subprocess.Popen(
    [sys.executable, "-c",
     "import sys, torch; from agentgym.model.weights import share_handles; "
     "w = torch.ones(4096); h = share_handles({'w': w}); print(h['w']['handle'], flush=True); sys.stdin.read()"],
    stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
)
name = child.stdout.readline().strip().lstrip("/")
# the worker and its children, torch's manager among them (in a session of its own): as Ray ends a worker
for proc in [*psutil.Process(child.pid).children(recursive=True), psutil.Process(child.pid)]:
    proc.kill()
child.wait()
time.sleep(0.5)
left = Path("/dev/shm") / name
print("left", left.exists())
kept = Path("/dev/shm") / f"torch_{os.getpid()}_1_0"  # a live process's: kept
kept.write_bytes(b"x")
removed = remove_orphans(Path("/dev/shm"), min_age_s=0)
print("removed", [p.name for p in removed] == [name], left.exists(), kept.exists())
"""


@pytest.mark.skipif(not _unshare_ok(), reason="mount namespaces are not allowed here (unshare -m)")
def test_the_orphan_sweep_removes_shared_weights_of_a_killed_worker(tmp_path):
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(SCENARIO))
    private = f"mount -t tmpfs tmpfs /dev/shm && {sys.executable} {script}"  # nobody else's files are swept
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", private],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert "left True" in out.stdout  # what happened before: the file outlived its process
    assert "removed True False True" in out.stdout
