"""The asynchronous trainer end to end on the tiny model: staleness 0 is the synchronous trainer,
off-policy correction, checkpoints that survive kill -9, the config that selects it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentgym.config import ConfigError
from agentgym.trainer.algos import rollout_is_weights
from agentgym.trainer.config import load_config

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(tmp_path: Path, name: str, overrides: list[str], config_name: str | None = None) -> dict:
    from agentgym.trainer.run import train

    cfg = load_config(
        env="first_letter",
        config_name=config_name,
        overrides=[
            f"trainer.default_local_dir={tmp_path / name}",
            "trainer.logger=[jsonl]",
            "trainer.use_ray=false",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "actor_rollout_ref.rollout.sampling_seed=1234",
            *overrides,
        ],
    )
    return train(cfg, show_progress=False)


# ---- staleness 0 is the synchronous trainer -----------------------------------------------------------------


@pytest.mark.parametrize("checkpoint_engine", ["false", "true"])
def test_staleness_zero_reproduces_the_synchronous_trainer(tmp_path, checkpoint_engine):
    """Same seeds, same samples, same losses (to 1e-6) and the same weights after 3 steps."""
    common = [
        "trainer.total_training_steps=3",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "trainer.save_freq=3",
    ]
    sync = _run(tmp_path, "sync", common)
    asyn = _run(
        tmp_path,
        "async",
        [
            *common,
            "async_training.staleness_threshold=0",
            "async_training.trigger_parameter_sync_step=1",
            "async_training.use_rollout_log_probs=false",
            "algorithm.rollout_correction.rollout_is=null",
            f"async_training.checkpoint_engine.enable={checkpoint_engine}",
        ],
        config_name="async_ppo_trainer",
    )
    a, b = _rows(Path(sync["metrics_file"])), _rows(Path(asyn["metrics_file"]))
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        for key in (
            "reward/mean",
            "response_length/mean",
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "critic/advantages/mean",
        ):
            assert abs(x[key] - y[key]) < 1e-6, (key, x[key], y[key])
        assert y["async/version_lag/max"] == 0 and y["async/version_lag/bound"] == 0
        assert y["async/servers_version"] == x["weight_sync/version"] - 1 == y["step"] - 1  # sampled by the latest
    samples = [
        (r["step"], r["seed"], [t["response_ids"] for t in r["turns"]]) for r in _rows(Path(sync["samples_file"]))
    ]
    assert samples == [
        (r["step"], r["seed"], [t["response_ids"] for t in r["turns"]]) for r in _rows(Path(asyn["samples_file"]))
    ]
    w_sync = torch.load(Path(sync["run_dir"]) / "global_step_3" / "actor" / "model.pt")
    w_async = torch.load(Path(asyn["run_dir"]) / "global_step_3" / "actor" / "model.pt")
    assert max(float((w_sync[k] - w_async[k]).abs().max()) for k in w_sync) < 1e-6
    batches = _rows(Path(asyn["run_dir"]) / "async_batches.jsonl")
    assert [[g["task"]["seed"] for g in r["groups"]] for r in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


# ---- off-policy correction ---------------------------------------------------------------------------------------


def test_truncated_importance_weights_token_and_sequence():
    old = torch.tensor([[0.0, -1.0, -2.0, 0.0], [-1.0, -1.0, 0.0, 0.0]])
    behaviour = torch.tensor([[-1.0, -1.0, -0.5, 0.0], [-1.2, -1.3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    w, m = rollout_is_weights(old, behaviour, mask, "token", threshold=2.0)
    ratios = torch.exp(old - behaviour)
    expected = torch.minimum(ratios, torch.tensor(2.0)) * mask
    assert torch.allclose(w, expected)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(float(ratios[mask.bool()].max()))  # e^1, before truncation
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(float(expected[mask.bool()].mean()))
    w, m = rollout_is_weights(old, behaviour, mask, "sequence", threshold=2.0)
    seq = torch.exp(((old - behaviour) * mask).sum(-1))  # e^-0.5 and e^0.5
    assert torch.allclose(w, torch.minimum(seq, torch.tensor(2.0))[:, None] * mask)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
    w, _ = rollout_is_weights(old, behaviour, mask, "token", threshold=2.0, batch_normalize=True)
    assert float(w[mask.bool()].mean()) == pytest.approx(1.0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_decoupled_ppo_weights_from_the_update_pass_take_the_recomputed_step(level):
    """One epoch over one mini-batch: the worker weighs pi_old / pi_behav in the update's own forward pass
    (the trainer skips the old log-prob pass) and takes the step, and reports the weights, that a recompute
    of the old log-probs first gives; without the weights the step differs."""
    from agentgym.trainer import algos
    from agentgym.trainer.batch import build_batch, pad_for_workers, update_plan
    from agentgym.trainer.worker_group import WorkerGroup
    from agentgym.trainer.workers import PolicyWorker
    from tests.trainer.test_trainer import make_trajectories

    def step(rollout_is: str | None, recompute: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        cfg = load_config(
            env="first_letter",
            config_name="async_ppo_trainer",
            overrides=[
                "trainer.use_ray=false",
                "trainer.device=cpu",
                "actor_rollout_ref.actor.optim.lr=1e-3",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # two micro-batches
                "data.train_batch_size=2",
                "actor_rollout_ref.rollout.n=4",
                f"algorithm.rollout_correction.rollout_is={rollout_is or 'null'}",
            ],
        )
        batch, _ = build_batch(make_trajectories(2, 4, seed=6), pad_token_id=0)
        mask = batch["response_mask"]
        # behaviour log-probs around the model's own, so some weights are truncated at 2 and some are not
        noise = torch.Generator().manual_seed(0)
        batch["rollout_log_probs"] = (torch.randn(mask.shape, generator=noise) * 0.7 - 6.5) * mask
        batch["advantages"], _ = algos.compute_advantage(
            "grpo", token_level_rewards=batch["token_level_scores"], response_mask=mask, index=batch.uid
        )
        rows = len(batch)
        batch, pads = pad_for_workers(batch, 1, [1])
        group = WorkerGroup(PolicyWorker, cfg, 1, False)
        try:
            group.call("init_model", 10, False)
            metrics: dict[str, float] = {}
            if recompute:
                old = group.call("compute_log_prob", group.put(batch.tensors), per_rank=[(list(range(rows)),)])
                batch["old_log_probs"] = old[0]["old_log_probs"]
                batch["rollout_is_weights"], metrics = algos.rollout_is_weights(
                    batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], level, 2.0
                )
            plan = update_plan(batch["response_mask"], rows, pads, 1, 1, 1)
            out = group.call("update_actor", group.put(batch.tensors), per_rank=[(p,) for p in plan])[0]
            return group.call("full_state_dict")[0], metrics if recompute else out
        finally:
            group.shutdown()

    recomputed, recomputed_metrics = step(level, recompute=True)
    in_pass, in_pass_metrics = step(level, recompute=False)
    unweighted, _ = step(None, recompute=False)
    assert max(float((recomputed[k] - in_pass[k]).abs().max()) for k in recomputed) < 1e-6
    assert max(float((unweighted[k] - in_pass[k]).abs().max()) for k in in_pass) > 1e-5
    assert 0 < recomputed_metrics["rollout_corr/rollout_is_ratio_fraction_high"] < 1 or level == "sequence"
    for key, value in recomputed_metrics.items():
        assert in_pass_metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_async_partial_rollout_with_decoupled_ppo_runs_and_logs(tmp_path):
    summary = _run(
        tmp_path,
        "is",
        [
            "trainer.total_training_steps=4",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            "async_training.partial_rollout=true",
            "async_training.trigger_parameter_sync_step=2",
            "async_training.staleness_threshold=0.5",
            "algorithm.rollout_correction.rollout_is=token",
        ],
        config_name="async_ppo_trainer",
    )
    rows = _rows(Path(summary["metrics_file"]))
    assert len(rows) == 4
    for row in rows:
        assert "timing_s/old_log_prob" not in row  # one mini-batch: the weights come from the update's pass
        assert row["async/version_lag/max"] <= row["async/version_lag/bound"] == 2  # ceil(1.5 * 2) - 1
        for key in (
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_max",
            "rollout_corr/rollout_is_ratio_fraction_high",
            "async/pool_size",
            "async/rollout_idle_frac",
            "async/trainer_idle_frac",
            "async/version_lag/min",
            "async/version_lag/mean",
        ):
            assert key in row, key
    assert rows[-1]["async/servers_version"] >= 2
    assert sum(summary["lag_histogram"].values()) == 4 * 4 * 4


# ---- the config ------------------------------------------------------------------------------------------------


def test_async_config_is_selected_by_name_and_checked():
    cfg = load_config(env="first_letter", config_name="async_ppo_trainer")
    assert cfg.actor_rollout_ref.hybrid_engine is False and cfg.async_training.trigger_parameter_sync_step == 2
    assert cfg.actor_rollout_ref.actor.use_rollout_log_probs is True  # follows async_training
    cfg = load_config(
        env="first_letter",
        config_name="async_ppo_trainer",
        overrides=["async_training.use_rollout_log_probs=false", "algorithm.rollout_correction.rollout_is=null"],
    )
    assert cfg.actor_rollout_ref.actor.use_rollout_log_probs is False
    with pytest.raises(ConfigError, match="use_rollout_log_probs=true"):  # decoupled PPO needs the behaviour logprobs
        load_config(
            env="first_letter",
            config_name="async_ppo_trainer",
            overrides=["async_training.use_rollout_log_probs=false"],
        )
    with pytest.raises(ConfigError, match="asynchronous trainer"):
        load_config(env="first_letter", overrides=["async_training.partial_rollout=true"])
    with pytest.raises(ConfigError, match="max_queue_size"):
        load_config(env="first_letter", config_name="async_ppo_trainer", overrides=["async_training.max_queue_size=2"])
    with pytest.raises(ConfigError, match="follows"):
        load_config(
            env="first_letter",
            config_name="async_ppo_trainer",
            overrides=[
                "actor_rollout_ref.actor.use_rollout_log_probs=false",
                "algorithm.rollout_correction.rollout_is=null",
            ],
        )
    with pytest.raises(ConfigError, match="rollout pool"):
        load_config(
            env="first_letter", config_name="async_ppo_trainer", overrides=["actor_rollout_ref.rollout.num_servers=2"]
        )
    with pytest.raises(ConfigError, match="Did you mean 'async_ppo_trainer'"):
        load_config(env="first_letter", config_name="async_ppo")


def test_agent_flows_pick_what_produces_trajectories(tmp_path, monkeypatch):
    from agentgym.gateway.agent_flows import resolve_agent_flow

    monkeypatch.chdir(ROOT)  # flow targets resolve from the working directory, as `agentgym train` does
    monkeypatch.syspath_prepend(str(ROOT))

    flows = tmp_path / "flows.yaml"
    flows.write_text(
        "- name: gsm8k_agent\n  _target_: examples.gsm8k_agent:run\n"
        "- name: partial\n  _target_: functools.partial\n  func: examples.gsm8k_agent.run\n"
    )
    cfg = load_config(env="first_letter")
    assert resolve_agent_flow(cfg) is None  # default: the env
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"actor_rollout_ref.rollout.agent.agent_flow_config_path={flows}",
            "actor_rollout_ref.rollout.agent.default_agent_flow=gsm8k_agent",
        ],
    )
    from examples.gsm8k_agent import run

    assert resolve_agent_flow(cfg) is run
    cfg.actor_rollout_ref.rollout.agent.default_agent_flow = "examples.gsm8k_agent:run"
    assert resolve_agent_flow(cfg) is run
    cfg.actor_rollout_ref.rollout.agent.default_agent_flow = "nope"
    with pytest.raises(ConfigError, match="gsm8k_agent"):
        resolve_agent_flow(cfg)


# ---- checkpoints: kill -9 and resume --------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_trains_every_task_once(tmp_path):
    """A checkpoint is a consistent cut (admission stopped, running episodes finished, the DataPool
    saved with the data order); work after it is lost with the process and done again on resume."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--async",
        "--env",
        "first_letter",
        f"trainer.default_local_dir={run_dir}",
        "trainer.use_ray=false",
        "trainer.total_training_steps=8",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        "trainer.save_hf_model=false",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.staleness_threshold=1.0",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    batches = run_dir / "async_batches.jsonl"
    deadline = time.monotonic() + 240
    try:
        while True:  # kill once a checkpoint exists and at least one step after it was trained
            latest = run_dir / "latest_checkpointed_iteration.txt"
            if latest.is_file() and batches.is_file():
                steps = [r["step"] for r in _rows(batches)]
                if steps and max(steps) > int(latest.read_text()):
                    break
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run never got past its first checkpoint"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    killed_at = int((run_dir / "latest_checkpointed_iteration.txt").read_text())
    assert killed_at < 8
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {run_dir / f'global_step_{killed_at}'}" in done.stdout
    last: dict[int, list[int]] = {}
    for record in _rows(batches):
        last[record["step"]] = [g["task"]["seed"] for g in record["groups"]]
    assert sorted(last) == list(range(1, 9))
    trained = sorted(seed for seeds in last.values() for seed in seeds)
    assert trained == list(range(8 * 4))  # every task once: none twice, none skipped


# ---- black-box agents ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("partial", ["false", "true"])
def test_black_box_agent_trains_through_the_gateway_in_async_mode(tmp_path, partial):
    """examples/gsm8k_agent.py (an openai-client agent) as the agent flow of the asynchronous trainer:
    sessions through the gateway, groups in the DataPool, weights pushed while agents run."""
    from agentgym.trainer.run import train

    rows = [{"question": f"What is {i} * 3?", "answer": f"so #### {3 * i}"} for i in range(8)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = load_config(
        config_name="async_ppo_trainer",
        overrides=[
            "env=agent",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.logger=[jsonl]",
            "trainer.use_ray=false",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "trainer.total_training_steps=4",
            f"data.train_files={data}",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=96",
            "actor_rollout_ref.rollout.max_tokens_per_turn=16",
            "actor_rollout_ref.rollout.agent.default_agent_flow=examples.gsm8k_agent:run",
            "async_training.trigger_parameter_sync_step=2",
            f"async_training.partial_rollout={partial}",
        ],
    )
    summary = train(cfg, show_progress=False)
    rows = _rows(Path(summary["metrics_file"]))
    assert len(rows) == 4 and all(r["async/version_lag/max"] <= r["async/version_lag/bound"] for r in rows)
    assert rows[-1]["async/servers_version"] == 2 and rows[-1]["episodes"] == 4
    batches = _rows(Path(summary["run_dir"]) / "async_batches.jsonl")
    trained = sorted(g["task"]["index"] for r in batches for g in r["groups"])
    assert trained == list(range(8))  # one epoch of tasks, each once
    samples = _rows(Path(summary["samples_file"]))
    assert {t["weight_version"] for r in samples if r["step"] >= 3 for t in r["turns"]} & {2}  # new weights reached


# ---- learning ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_async_learns_first_letter_as_well_as_sync(tmp_path):
    """The same number of samples (20 updates x 8 tasks x 8 episodes) reaches the same held-out reward
    (32 unseen tasks x 8 sampled episodes at temperature 1) within 0.05, with the asynchronous
    defaults (staleness 0.1, a push every 2 updates: lags up to 2, decoupled PPO)."""
    held_out = [
        "trainer.total_training_steps=20",
        "trainer.test_freq=20",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.n=8",
    ]
    sync = _run(tmp_path, "sync", held_out)["val_metrics"]["val/reward/mean"]
    summary = _run(tmp_path, "async", held_out, config_name="async_ppo_trainer")
    assert max(summary["lag_histogram"]) == 2  # it did train on stale samples, up to the bound
    asyn = summary["val_metrics"]["val/reward/mean"]
    assert sync > 0.8 and abs(asyn - sync) <= 0.05, (sync, asyn)


def test_resume_from_a_checkpoint_inside_a_require_batches_fetch(tmp_path):
    """require_batches=2 takes updates 1 and 2's groups at once; a checkpoint after update 1 saves
    update 2's (taken, not trained) back into the pool, so a run resumed there trains them."""
    common = [
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "async_training.require_batches=2",
        "async_training.trigger_parameter_sync_step=2",
        "trainer.save_freq=1",
    ]
    _run(tmp_path, "run", [*common, "trainer.total_training_steps=3"], config_name="async_ppo_trainer")
    resumed = _run(
        tmp_path,
        "run",
        [
            *common,
            "trainer.total_training_steps=4",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path / 'run' / 'global_step_1'}",
        ],
        config_name="async_ppo_trainer",
    )
    assert resumed["steps"] == 4 and resumed["steps_run"] == 3
    last: dict[int, list[int]] = {}
    for record in _rows(Path(resumed["run_dir"]) / "async_batches.jsonl"):
        last[record["step"]] = [g["task"]["seed"] for g in record["groups"]]
    assert sorted(seed for seeds in last.values() for seed in seeds) == list(range(8))


# ---- dynamic sampling ----------------------------------------------------------------------------------------


def _scripted_source(flat):
    """Tasks seed 0, 1, ...; each a group of 2 one-turn episodes that all score 0 when ``flat(seed)``, else 0, 1."""
    from agentgym.rollout.sources import TrajectorySource
    from agentgym.types import Trajectory, Turn

    class Scripted(TrajectorySource):
        def __init__(self) -> None:
            self.seed = 0

        async def collect(self, step: int) -> list[Trajectory]:
            raise AssertionError("the asynchronous trainer runs tasks one by one")

        async def next_tasks(self) -> list[dict]:
            self.seed += 2
            return [{"seed": self.seed - 2}, {"seed": self.seed - 1}]

        async def run_task(self, task: dict, group_id: str) -> list[Trajectory]:
            seed = task["seed"]
            return [
                Trajectory(
                    turns=[Turn(prompt_ids=[5, 6, 7], response_ids=[8 + seed % 7, 9], logprobs=[-1.0, -1.0])],
                    outcome_reward=0.0 if flat(seed) else float(i),
                    seed=seed,
                    task=dict(task),
                )
                for i in range(2)
            ]

    return Scripted()


def _scripted_run(tmp_path: Path, name: str, flat, overrides: list[str]) -> dict:
    from agentgym.trainer.run import train

    cfg = load_config(
        env="first_letter",
        config_name="async_ppo_trainer",
        overrides=[
            f"trainer.default_local_dir={tmp_path / name}",
            "trainer.logger=[jsonl]",
            "trainer.use_ray=false",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "trainer.total_training_steps=3",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "async_training.staleness_threshold=0.5",
            "async_training.trigger_parameter_sync_step=1",
            "async_training.use_rollout_log_probs=false",
            "algorithm.rollout_correction.rollout_is=null",
            *overrides,
        ],
    )
    return train(cfg, source=_scripted_source(flat), servers=False, show_progress=False)


@pytest.mark.parametrize("enable", [True, False])
def test_async_dynamic_sampling_trains_no_group_without_signal(tmp_path, enable):
    """Even seeds are flat. With algorithm.filter_groups on, no update trains one (the batches record every
    trained task) and the sync trainer's sampling/* metrics say how many were dropped; off, they are trained."""
    summary = _scripted_run(
        tmp_path, "ds", lambda seed: seed % 2 == 0, [f"algorithm.filter_groups.enable={str(enable).lower()}"]
    )
    seeds = [g["task"]["seed"] for r in _rows(Path(summary["run_dir"]) / "async_batches.jsonl") for g in r["groups"]]
    rows = _rows(Path(summary["metrics_file"]))
    assert len(rows) == 3 and len(seeds) == 6
    if enable:
        assert all(seed % 2 for seed in seeds)
        assert sum(r["sampling/groups_dropped"] for r in rows) >= 3 and rows[0]["sampling/flat_group_frac"] > 0
        assert summary["flat_reward_steps"] == 0
    else:
        assert any(seed % 2 == 0 for seed in seeds) and not any("sampling/groups_dropped" in r for r in rows)


def test_async_trainer_trains_no_flat_group_the_filter_kept_past_its_budget(tmp_path):
    """max_num_gen_batches=1 (no group may be dropped: a synchronous step trains the groups of its one round
    that have a signal): every flat group reaches the pool, and no update trains one beside the groups with a
    signal it took; the metrics say how many were left out and that every trained group had a signal."""
    summary = _scripted_run(
        tmp_path,
        "budget",
        lambda seed: seed % 2 == 0,
        ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=1"],
    )
    seeds = [g["task"]["seed"] for r in _rows(Path(summary["run_dir"]) / "async_batches.jsonl") for g in r["groups"]]
    rows = _rows(Path(summary["metrics_file"]))
    assert len(rows) == 3 and seeds and all(seed % 2 for seed in seeds)
    assert all(r["batch/zero_variance_group_frac"] == 0.0 for r in rows)
    assert sum(r["sampling/groups_dropped"] for r in rows) == 0
    assert sum(r["sampling/flat_groups_left_out"] for r in rows) == len(seeds) == 3
    assert summary["flat_reward_steps"] == 0


def test_async_distillation_drops_no_group_by_env_score(tmp_path):
    """A teacher scores (distillation.enable) with algorithm.filter_groups on: the filter judges env scores,
    which say nothing of what the teacher teaches, so it is off and the env-flat groups are trained too."""
    summary = _scripted_run(
        tmp_path,
        "distill",
        lambda seed: seed % 2 == 0,
        ["algorithm.filter_groups.enable=true", "distillation.enable=true", "distillation.teacher.path=tiny"],
    )
    seeds = [g["task"]["seed"] for r in _rows(Path(summary["run_dir"]) / "async_batches.jsonl") for g in r["groups"]]
    rows = _rows(Path(summary["metrics_file"]))
    assert len(rows) == 3 and any(seed % 2 == 0 for seed in seeds)
    assert not any("sampling/groups_dropped" in r for r in rows)


def test_async_dynamic_sampling_ends_when_every_group_is_flat(tmp_path, caplog):
    """Every group flat, max_num_gen_batches=2 (a step may drop 2 * 2 - 2 = 2 groups): the run ends, its
    steps train flat groups past the budget and the flat-reward warning says so, as in the sync trainer."""
    with caplog.at_level("WARNING", logger="agentgym.trainer"):
        summary = _scripted_run(
            tmp_path,
            "flat",
            lambda seed: True,
            ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2"],
        )
    rows = _rows(Path(summary["metrics_file"]))
    assert len(rows) == 3 and summary["flat_reward_steps"] == 3
    assert all(r["sampling/groups_dropped"] <= 2 and r["sampling/flat_group_frac"] == 1.0 for r in rows)
    assert rows[0]["sampling/groups_dropped"] == 2
    assert "identical rewards" in caplog.text
