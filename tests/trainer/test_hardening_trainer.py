"""The trainer when things go wrong (issue 16, "Trainer").

A dead policy server stops the run (exit 1, the server named) instead of "done" with exit 0;
samples of weights a restarted server lost are refused and the weights pushed again; a corrupt
checkpoint or a bad ``latest`` file is refused; a kill -9 and resume neither loses nor doubles a
metrics line; the shared-memory push directory goes on SIGTERM and after a kill -9; each failing
episode is counted once; a hung env thread does not keep the process alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentgym.envs.first_letter import FirstLetterEnv
from agentgym.rollout.sources import SourceWrapper
from agentgym.server.handles import free_port
from agentgym.trainer import checkpoint
from agentgym.trainer.config import load_config
from tests.trainer.test_checkpoint import _run

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "trainer.use_ray=false",
    "trainer.logger=[jsonl]",
    "trainer.val_before_train=false",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "data.max_response_length=16",
    "trainer.save_hf_model=false",
]


def run_python(code: str, timeout: float = 300, argv: list[str] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---- fail loudly -------------------------------------------------------------------------------------
def test_a_dead_policy_server_is_refused_before_the_run_with_exit_2(tmp_path, capsys):
    from agentgym.cli import main

    dead = f"http://127.0.0.1:{free_port()}"
    code = main(
        [
            "train",
            "--env",
            "first_letter",
            *FAST,
            f"trainer.default_local_dir={tmp_path}",
            "trainer.total_training_steps=3",
            f"actor_rollout_ref.rollout.server_urls=[{dead}]",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"the policy server {dead}" in err and "does not answer" in err


def test_a_policy_server_that_dies_after_the_check_stops_the_run_with_exit_1_and_names_it(
    tmp_path, capsys, monkeypatch
):
    from agentgym import preflight
    from agentgym.cli import main

    monkeypatch.setattr(preflight, "check_servers", lambda cfg: None)  # it answered then, it is gone now
    dead = f"http://127.0.0.1:{free_port()}"
    code = main(
        [
            "train",
            "--env",
            "first_letter",
            *FAST,
            f"trainer.default_local_dir={tmp_path}",
            "trainer.total_training_steps=3",
            f"actor_rollout_ref.rollout.server_urls=[{dead}]",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "8 of 8 episodes failed" in err and "max_failed_episode_frac" in err
    assert f"Not answering /health: {dead}" in err
    assert not (tmp_path / "huggingface").exists()


class _RestartingSource(SourceWrapper):
    """The env source, with the policy server "restarted" (initial weights, version 0) before ``at``."""

    def __init__(self, inner, server, at: int) -> None:
        super().__init__(inner)
        self.server, self.at = server, at

    async def collect(self, step: int):
        if step == self.at:
            from agentgym.model import load_causal_lm

            self.server.update_weights(load_causal_lm("tiny").state_dict(), 0)
        return await self.source.collect(step)


def test_samples_of_lost_weights_are_refused_and_the_weights_pushed_again(tmp_path, caplog):
    from agentgym.model import load_tokenizer
    from agentgym.rollout.sources import EnvRolloutSource
    from agentgym.server.launch import start_embedded_server
    from agentgym.trainer.rollout_servers import RolloutServers
    from agentgym.trainer.run import train

    with start_embedded_server("tiny") as server:
        cfg = load_config(
            env="first_letter",
            overrides=[
                *FAST,
                f"trainer.default_local_dir={tmp_path}",
                "trainer.total_training_steps=3",
                f"actor_rollout_ref.rollout.server_urls=[{server.url}]",
                f"actor_rollout_ref.rollout.server_admin_key={server.admin_key}",
            ],
        )
        servers = RolloutServers(cfg)
        source = _RestartingSource(EnvRolloutSource(cfg, servers.client, load_tokenizer("tiny")), server, at=2)
        train(cfg, source=source, servers=servers, show_progress=False)
        assert server.weight_version == 3
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/stale_episodes"] for r in rows] == [0, 8, 0]
    assert rows[1]["batch/trainable"] == 0  # nothing of version 0 was trained on at step 2
    assert rows[2]["rollout/weight_version_lag"] == 0  # the weights were pushed again at once
    assert "not trained on" in caplog.text


def test_servers_that_report_no_version_are_taken_to_hold_what_was_pushed(tmp_path):
    """vLLM reports no weight version with its samples: the client's record of each server is then the
    version of their turns, so it must follow every push (else every sample would look stale)."""
    import asyncio

    from agentgym.model import load_causal_lm
    from agentgym.trainer.rollout_servers import RolloutServers

    cfg = load_config(env="first_letter", overrides=[*FAST, f"trainer.default_local_dir={tmp_path}"])
    servers = RolloutServers(cfg)  # an embedded server in this process: pushes go through its handle
    try:
        asyncio.run(servers.update(load_causal_lm("tiny").state_dict(), 5))
        assert [s.version for s in servers.client.servers] == [5]
    finally:
        servers.stop()


# ---- checkpoints ------------------------------------------------------------------------------------------
GRPO = ("algorithm=grpo", "actor_rollout_ref.actor.use_kl_loss=false")


def test_a_corrupt_checkpoint_is_refused(tmp_path):
    _run(tmp_path, 2, "trainer.save_freq=1", *GRPO)
    model = tmp_path / "global_step_2" / "actor" / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, in the middle of the weights
    model.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=r"actor/model.pt does not match") as refused:
        _run(tmp_path, 3, "trainer.save_freq=1", *GRPO)
    assert "global_step_1" in str(refused.value) and "resume_from_path" in str(refused.value)


@pytest.mark.parametrize("latest", ["abc", "9", ""])
def test_a_bad_latest_file_is_refused_not_a_restart_from_step_0(tmp_path, latest):
    _run(tmp_path, 1, "trainer.save_freq=1", *GRPO)
    (tmp_path / checkpoint.LATEST_FILE).write_text(latest)
    with pytest.raises(checkpoint.CheckpointError, match="global_step_1"):
        _run(tmp_path, 2, "trainer.save_freq=1", *GRPO)


# ---- metrics across kill -9 -----------------------------------------------------------------------------
KILLED_RUN = """
    import os, signal, sys
    from tests.trainer.test_checkpoint import _run
    from agentgym.trainer.ppo_trainer import PPOTrainer

    directory, steps, save_freq, kill_after_save, kill_at_step = sys.argv[1], *map(int, sys.argv[2:])
    save, train_step = PPOTrainer.save_checkpoint, PPOTrainer.train_step

    def saving(self, step, *args, **kwargs):
        out = save(self, step, *args, **kwargs)
        if step == kill_after_save:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    def stepping(self, step):
        if step == kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return train_step(self, step)

    PPOTrainer.save_checkpoint, PPOTrainer.train_step = saving, stepping
    from pathlib import Path
    _run(Path(directory), steps, f"trainer.save_freq={save_freq}", "algorithm=grpo",
         "actor_rollout_ref.actor.use_kl_loss=false")
"""


@pytest.mark.parametrize(
    "kill_after_save,kill_at_step,save_freq",
    [(2, 0, 1), (0, 4, 2)],
    ids=["killed between a checkpoint and its metrics line", "killed after the checkpoint's next step"],
)
def test_kill_9_and_resume_neither_loses_nor_doubles_a_metrics_line(tmp_path, kill_after_save, kill_at_step, save_freq):
    steps = 4
    killed = run_python(
        KILLED_RUN, 300, [str(tmp_path), str(steps), str(save_freq), str(kill_after_save), str(kill_at_step)]
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = run_python(KILLED_RUN, 300, [str(tmp_path), str(steps), str(save_freq), "0", "0"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all("actor/pg_loss" in r for r in rows)


# ---- temporary files ---------------------------------------------------------------------------------------
def test_the_push_directory_goes_when_the_trainer_is_terminated(tmp_path):
    from agentgym.model.weights import push_dir
    from agentgym.server.launch import start_embedded_server

    with start_embedded_server("tiny") as server:  # a server given by URL: weights go through /dev/shm
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "train",
                "--env",
                "first_letter",
                *FAST,
                f"trainer.default_local_dir={tmp_path}",
                "trainer.total_training_steps=500",
                f"actor_rollout_ref.rollout.server_urls=[{server.url}]",
                f"actor_rollout_ref.rollout.server_admin_key={server.admin_key}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            while server.weight_version < 1:  # the first push has made the directory
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.2)
            assert list(push_dir().glob(f"agentgym-policy-{proc.pid}-*"))
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    leftover = list(push_dir().glob(f"agentgym-policy-{proc.pid}-*"))
    for path in leftover:  # do not leave them to the next test run
        subprocess.run(["rm", "-rf", str(path)], check=False)
    assert not leftover, "the push directory outlived the run"
    assert proc.returncode == 128 + signal.SIGTERM


def test_push_files_of_a_killed_trainer_are_removed_by_the_next(tmp_path):
    from agentgym.trainer.weight_sync import remove_orphans

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    orphan = tmp_path / f"agentgym-policy-{pid}-0a1b2c3d"
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"x" * 1000)
    stray = tmp_path / f"agentgym-weights-{pid}-3.safetensors"
    stray.write_bytes(b"y")
    mine = tmp_path / f"agentgym-policy-{os.getpid()}-deadbeef"
    mine.mkdir()
    fresh = tmp_path / f"agentgym-policy-{pid}-fresh000"  # just written: maybe another PID namespace's
    fresh.mkdir()
    hour_ago = time.time() - 3600
    for path in (orphan, stray, mine):
        os.utime(path, (hour_ago, hour_ago))
    assert sorted(remove_orphans(tmp_path)) == sorted([orphan, stray])
    assert mine.exists() and fresh.exists() and not orphan.exists() and not stray.exists()


class _BlockingWriter:
    """An actor whose weight write waits for ``release``, then makes its own directory (as peft's
    ``save_pretrained`` does) and writes a file in it."""

    use_ray = False
    workers: list = []

    def __init__(self):
        import threading

        self.entered, self.release = threading.Event(), threading.Event()

    def call(self, method, path):
        self.entered.set()
        self.release.wait(30)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"w" * 100)
        return [{"bytes": 100.0}]


class _DirectoryServers:
    handles: list = []

    def remote_urls(self):
        return []

    def in_process_handles(self):
        return []

    async def update(self, weights, version, abort=False):
        pass


def test_cleanup_waits_for_a_write_in_flight_and_no_write_follows_it(tmp_path):
    """SIGTERM ends the run while a thread still writes the weights: removing the directory under it
    would let the write bring it back (a CI run found one left in /dev/shm)."""
    import asyncio
    import threading

    from agentgym.trainer.weight_sync import WeightSync

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    actor = _BlockingWriter()
    sync = WeightSync(_DirectoryServers(), actor, str(tmp_path / "model"), directory=tmp_path / "shm")
    pushing = threading.Thread(target=lambda: asyncio.run(sync.push(1)), daemon=True)
    pushing.start()
    assert actor.entered.wait(30)
    cleaning = threading.Thread(target=sync.cleanup)
    cleaning.start()
    cleaning.join(0.5)
    assert cleaning.is_alive(), "cleanup removed the directory while a write was in flight"
    actor.release.set()
    cleaning.join(30)
    pushing.join(30)
    assert not cleaning.is_alive() and not pushing.is_alive()
    assert not list((tmp_path / "shm").iterdir())
    with pytest.raises(RuntimeError, match="removed at shutdown"):
        asyncio.run(sync.push(2))
    assert not list((tmp_path / "shm").iterdir())


def test_cleanup_removes_the_lora_adapter_directories_too(tmp_path):
    from agentgym.trainer.weight_sync import WeightSync

    sync = WeightSync(_DirectoryServers(), _BlockingWriter(), "tiny", directory=tmp_path)
    adapter = sync.directory.with_name(sync.directory.name + "-lora-7")
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"a")
    other = tmp_path / "agentgym-policy-1-feedbeef-lora-7"  # another run's
    other.mkdir()
    sync.cleanup()
    assert not adapter.exists() and other.exists()


# ---- env failures -------------------------------------------------------------------------------------------
HANGS = 17


class HangingEnv(FirstLetterEnv):
    """FirstLetter whose episodes of seed ``HANGS`` never return from ``step``."""

    def reset(self, seed=None, options=None):
        self.hang = seed == HANGS
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.hang:
            time.sleep(3600)
        return super().step(action)


async def test_the_process_executor_counts_each_failing_episode_once(standin_server):
    """A hung step held its worker process, so calls queued behind it timed out too: 12 failures were
    counted for 6 failing episodes. Only the hung episodes may fail. (The fix is the adapters branch's
    executors, merged in 8734630; this test failed on 2b6ae53.)"""
    from agentgym.rollout import RolloutConfig, RolloutRunner, Task

    standin_server.token_ids = [5, 6, 7]
    from agentgym.client import PolicyClient

    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(
            HangingEnv,
            client,
            "tiny",
            RolloutConfig(
                n=3, env_executor="process", env_workers=2, env_timeout=1.5, max_concurrency=12, max_tokens=4
            ),
        )
        try:
            result = await runner.run([Task(seed=s) for s in (11, HANGS, 13, 15, HANGS + 100, 19)])
        finally:
            await runner.aclose()
    failed = [t for t in result.trajectories if t.status == "failed"]
    assert {t.seed for t in failed} == {HANGS}, [(t.seed, t.failure) for t in failed]
    assert result.metrics["failed"] == 3


HUNG_TRAIN = f"""
    import agentgym
    from tests.trainer.test_hardening_trainer import HangingEnv
    from agentgym.cli import main

    agentgym.register("hanging_first_letter", HangingEnv)
    raise SystemExit(main(["train", "--env", "hanging_first_letter", *{FAST!r}, "trainer.default_local_dir=DIR",
                           "trainer.total_training_steps=1", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                           "env.train_seed_start={HANGS - 1}", "env.timeout=2", "trainer.shutdown_timeout=2"]))
"""


def test_a_hung_env_thread_does_not_keep_the_process_alive(tmp_path):
    started = time.monotonic()
    try:
        done = run_python(HUNG_TRAIN.replace("DIR", str(tmp_path)), timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("agentgym train never exited: its hung env thread kept the interpreter alive")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done: 1 steps" in done.stdout and "still running" in done.stderr
    assert time.monotonic() - started < 200
