"""The run directory every node sees: resolved once on the driver to an absolute path, storage URIs and
a relative path inside a Ray job's working-dir copy refused, a rank that cannot see the driver's files
detected before any work, and a checkpoint a worker wrote where the driver cannot see it refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.config import ConfigError
from agentgym.trainer import checkpoint
from agentgym.trainer.run_storage import RunDirNotShared, check_shared, resolve_run_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_relative_run_dir_becomes_absolute_against_the_drivers_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_run_dir("outputs/x") == str(tmp_path / "outputs" / "x")
    assert resolve_run_dir(str(tmp_path / "abs")) == str(tmp_path / "abs")
    assert resolve_run_dir(f"file://{tmp_path}/f") == str(tmp_path / "f")


@pytest.mark.parametrize("uri", ["s3://bucket/run", "gs://b/r", "hdfs://nn/r"])
def test_a_storage_uri_is_refused_with_the_way_out(uri):
    with pytest.raises(ConfigError, match="Mount the bucket at the same path on every node"):
        resolve_run_dir(uri)


def test_relative_inside_a_ray_jobs_working_dir_copy_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    copy = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_abc"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    with pytest.raises(ConfigError, match="which Ray deletes"):
        resolve_run_dir("outputs/run")
    assert resolve_run_dir("/shared/runs/x") == "/shared/runs/x"


def test_relative_in_a_ray_job_entrypoint_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {}}')  # what ray job submit sets
    with pytest.raises(ConfigError, match="runs as a Ray job in .* \\(the directory `ray start` ran in"):
        resolve_run_dir("outputs/run")
    assert resolve_run_dir(str(tmp_path / "abs")) == str(tmp_path / "abs")


def test_prepare_training_fixes_the_run_dir_before_any_stage(tmp_path, monkeypatch):
    from agentgym.stages.train_command import prepare_training

    monkeypatch.chdir(tmp_path)
    cfg, _, _ = prepare_training("first_letter", None, None, ["trainer.default_local_dir=runs/a"])
    assert cfg.trainer.default_local_dir == str(tmp_path / "runs" / "a")


def test_the_manifest_refuses_files_the_workers_wrote_where_the_driver_cannot_see_them(tmp_path):
    step = checkpoint.step_dir(tmp_path, 2)
    (step / "actor").mkdir(parents=True)
    (step / "actor" / "model.pt").write_bytes(b"x")
    checkpoint.save_trainer_state(step, {"global_step": 2})
    with pytest.raises(checkpoint.CheckpointError, match="split across nodes.*actor/optim.pt"):
        checkpoint.mark_latest(tmp_path, 2, ["actor/model.pt", "actor/optim.pt"])
    assert not (tmp_path / checkpoint.LATEST_FILE).exists()  # nothing sealed
    checkpoint.mark_latest(tmp_path, 2, ["actor/model.pt"])
    assert checkpoint.latest_checkpoint(tmp_path) == step


def _unshare_ok() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


class OtherHostGroup:
    """A worker group of one rank that runs ``Worker.sees_run_dir`` in another process whose mount
    namespace has its own (empty) filesystem at the run directory: a node with a local disk there."""

    use_ray = True

    def __init__(self, shadow: Path | None) -> None:
        self.shadow = shadow

    def call(self, method, root, token):
        code = (
            "import json, sys; from agentgym.trainer.run_storage import sees_run_dir; "
            f"print(json.dumps(sees_run_dir({root!r}, {token!r}, 0)))"
        )
        mount = f"mount -t tmpfs tmpfs {self.shadow} && " if self.shadow else ""
        out = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{mount}{sys.executable} -c "{code}"'],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        import json

        return [json.loads(out.stdout.strip().splitlines()[-1])]


@pytest.mark.skipif(not _unshare_ok(), reason="mount namespaces are not allowed here (unshare -m)")
def test_a_rank_on_a_node_without_the_run_dir_is_refused_before_any_work(tmp_path):
    run = tmp_path / "run"
    check_shared(OtherHostGroup(None), run)  # same filesystem: passes
    assert not list(run.iterdir())  # the markers are cleaned up
    with pytest.raises(RunDirNotShared, match=r"rank 0 on .* cannot see the files.*storage every node mounts"):
        check_shared(OtherHostGroup(tmp_path), run)
    assert not list(run.iterdir())
