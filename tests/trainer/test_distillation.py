"""On-policy distillation (``distillation.*``): the teacher scores exactly the sampled tokens with their
whole context, by a worker here or by vLLM / SGLang servers, a teacher with another tokenizer is
refused, and the trainer adds the per-token reverse KL to the advantages."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from agentgym.config import ConfigError
from agentgym.model import load_causal_lm, tiny_model_path
from agentgym.rewards.teacher import TeacherScorer, TeacherSettings, TeacherWorker, check_tokenizers
from agentgym.trainer.algos.distill import compute_distillation_advantage
from agentgym.trainer.batch import build_batch
from agentgym.trainer.distillation import teacher_log_probs
from agentgym.types import Trajectory, Turn


def episode(seed: int, turns: int = 2, group: str = "g") -> Trajectory:
    """A multi-turn episode: the first prompt, then per turn the sampled tokens and the env's reply."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(turns):
        prompt = torch.randint(3, 600, (9 if t == 0 else 3,), generator=gen).tolist()
        response = torch.randint(3, 600, (4 + t,), generator=gen).tolist()
        out.append(Turn(prompt_ids=prompt, response_ids=response, logprobs=[-6.0] * len(response)))
    return Trajectory(turns=out, group_id=group)


@functools.lru_cache(maxsize=1)
def tiny_lm():
    return load_causal_lm("tiny")


def full_forward_logprobs(traj: Trajectory) -> list[list[float]]:
    """The tiny model's logprob of each sampled token, from one forward over the whole sequence."""
    model = tiny_lm()
    ids = torch.tensor([traj.token_ids()])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0]
    out, pos = [], 0
    for turn in traj.turns:
        pos += len(turn.prompt_ids)
        out.append([float(logp[pos + k - 1, tok]) for k, tok in enumerate(turn.response_ids)])
        pos += len(turn.response_ids)
    return out


def settings(**kw) -> TeacherSettings:
    base = {
        "path": "tiny",
        "server_urls": (),
        "backend": "vllm",
        "model": None,
        "tokenizer": None,
        "micro_batch_size": 2,
        "concurrency": 4,
        "timeout": 10.0,
        "max_retries": 2,
        "use_ray": False,
    }
    return TeacherSettings(**{**base, **kw})


def test_the_teacher_scores_only_the_sampled_tokens_given_the_whole_context():
    trajs = [episode(1), episode(2, turns=3), episode(3, turns=1)]
    counts = asyncio.run(TeacherScorer(settings(), "tiny").score(trajs))
    assert counts == {"distill/teacher_scored": 3.0, "distill/teacher_errors": 0.0}
    for traj in trajs:
        expected = full_forward_logprobs(traj)
        for turn, values in zip(traj.turns, expected, strict=True):
            assert len(turn.teacher_logprobs) == len(turn.response_ids)  # no prompt or env token is scored
            assert turn.teacher_logprobs == pytest.approx(values, abs=1e-4)


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    tok.add_tokens(["<extra_teacher_token>"])
    tok.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="do not share a tokenizer: their vocabularies differ"):
        check_tokenizers("tiny", str(tmp_path))
    check_tokenizers("tiny", str(tiny_model_path()))  # the same files under another name pass


def test_the_config_names_the_teacher_it_needs():
    from agentgym.trainer.config import load_config

    with pytest.raises(ConfigError, match="teacher.path=DIR .* or distillation.teacher.server_urls"):
        load_config(env="first_letter", overrides=["distillation.enable=true"], warn=False)
    with pytest.raises(ConfigError, match="needs distillation.teacher.tokenizer"):
        load_config(
            env="first_letter",
            overrides=["distillation.enable=true", "distillation.teacher.server_urls=[http://x:1]"],
            warn=False,
        )


class StandinTeacherServer:
    """vLLM's ``/v1/completions`` with ``prompt_logprobs`` and SGLang's ``/generate`` with
    ``input_token_logprobs``, answered by the tiny model; the first ``fail_first`` requests get 500."""

    def __init__(self, fail_first: int = 0) -> None:
        self.worker = TeacherWorker("tiny", 4)
        self.fail_left = fail_first
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    if outer.fail_left > 0:
                        outer.fail_left -= 1
                        self._send(500, {"error": "busy"})
                        return
                    ids = request.get("prompt") or request["input_ids"]
                    values = outer.worker.logprobs([ids], [list(range(1, len(ids)))])[0]
                if self.path == "/v1/completions":
                    table = [None] + [{str(t): {"logprob": v, "rank": 1}} for t, v in zip(ids[1:], values, strict=True)]
                    self._send(200, {"choices": [{"text": "", "prompt_logprobs": table}]})
                else:
                    table = [[None, ids[0], None]] + [[v, t, None] for t, v in zip(ids[1:], values, strict=True)]
                    self._send(200, {"text": "", "meta_info": {"input_token_logprobs": table}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_a_teacher_on_servers_gives_the_same_logprobs_and_retries_failures(backend):
    server = StandinTeacherServer(fail_first=2)
    try:
        trajs = [episode(4), episode(5)]
        scorer = TeacherScorer(
            settings(path=None, server_urls=(server.url,), backend=backend, tokenizer="tiny"), "tiny"
        )
        counts = asyncio.run(scorer.score(trajs))
    finally:
        server.stop()
    assert counts["distill/teacher_errors"] == 0
    for traj in trajs:
        for turn, values in zip(traj.turns, full_forward_logprobs(traj), strict=True):
            assert turn.teacher_logprobs == pytest.approx(values, abs=1e-4)


def test_an_episode_the_teacher_servers_cannot_score_is_kept_out_not_made_up():
    server = StandinTeacherServer(fail_first=100)
    try:
        traj = episode(6)
        scorer = TeacherScorer(settings(path=None, server_urls=(server.url,), tokenizer="tiny", max_retries=1), "tiny")
        counts = asyncio.run(scorer.score([traj]))
    finally:
        server.stop()
    assert counts["distill/teacher_errors"] == 1 and traj.status == "failed" and "teacher" in traj.failure
    assert all(not turn.teacher_logprobs for turn in traj.turns)


# ---- the advantage ------------------------------------------------------------------------------------
def test_the_advantage_is_the_env_one_minus_the_per_token_reverse_kl():
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    student = torch.tensor([[-1.0, -2.0, -3.0, 0.0]])
    teacher = torch.tensor([[-1.5, -1.0, -3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])  # the third token was not scored by the teacher
    out, metrics = compute_distillation_advantage(adv, student, teacher, mask, kl_coef=2.0, env_coef=0.5)
    assert out.tolist() == [[0.5 - 2.0 * 0.5, 0.5 + 2.0 * 1.0, 0.5, 0.0]]
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.25) and metrics["distill/scored_tokens"] == 2
    pure, _ = compute_distillation_advantage(adv, student, teacher, mask, env_coef=0.0)
    assert pure.tolist() == [[-0.5, 1.0, 0.0, 0.0]]


def test_teacher_logprobs_line_up_with_the_batch_layout():
    trajs = [episode(7, turns=3), episode(8, turns=2)]
    asyncio.run(TeacherScorer(settings(), "tiny").score(trajs))
    trajs[1].turns[1].teacher_logprobs = []  # a turn no teacher scored
    batch, _ = build_batch(trajs, pad_token_id=0)
    teacher, scored = teacher_log_probs(trajs, batch)
    for i, traj in enumerate(trajs):
        picked = teacher[i][scored[i].bool()].tolist()
        expected = [v for turn in traj.turns for v in turn.teacher_logprobs]
        assert picked == pytest.approx(expected, abs=1e-6)
    assert scored[0].sum() == batch["response_mask"][0].sum() and scored[1].sum() < batch["response_mask"][1].sum()


@pytest.mark.parametrize("enable", [True, False])
def test_a_trainer_step_learns_from_the_teacher_when_every_env_reward_is_equal(tmp_path, enable):
    """Every episode scored 0 by the env: GRPO's advantages are all 0 and the step is flat. With
    distillation the teacher's per-token advantages remain (teacher logprob -1 on every sampled token,
    the student's -6: +5 each) and the step is not counted flat."""
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.trainer.config import load_config
    from agentgym.trainer.ppo_trainer import PPOTrainer

    trajs = [episode(10 + i, group=f"g{i // 2}") for i in range(4)]
    for traj in trajs:
        for turn in traj.turns:
            turn.teacher_logprobs = [-1.0] * len(turn.response_ids)
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"distillation.enable={str(enable).lower()}",
            "distillation.teacher.path=tiny",
            "distillation.env_coef=0",
            "trainer.use_ray=false",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "data.max_response_length=64",
        ],
        warn=False,
    )
    trainer = PPOTrainer(cfg, FixedTrajectorySource([trajs]), servers=None, show_progress=False)
    try:
        summary = trainer.fit()
    finally:
        trainer.shutdown()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    if enable:
        assert row["distill/reverse_kl"] == pytest.approx(-5.0) and row["critic/advantages/mean"] == pytest.approx(5.0)
        assert summary["flat_reward_steps"] == 0
    else:
        assert "distill/reverse_kl" not in row and row["critic/advantages/mean"] == 0.0
        assert summary["flat_reward_steps"] == 1


@pytest.mark.parametrize("distill", [True, False])
def test_no_group_is_dropped_by_env_score_while_a_teacher_scores(tmp_path, caplog, distill):
    """Dynamic sampling on, one group flat by env score (g0) and one with a spread (g1), one rollout round:
    without a teacher the flat group is dropped; with one both groups reach the update (the teacher scores
    them all), and a line says the filter is off."""
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    trajs = [episode(20 + i, group=f"g{i // 2}") for i in range(4)]
    trajs[3].outcome_reward = 1.0
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"distillation.enable={str(distill).lower()}",
            "distillation.teacher.path=tiny",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.max_num_gen_batches=1",
            "trainer.use_ray=false",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "data.max_response_length=64",
        ],
        warn=False,
    )
    with caplog.at_level("WARNING", logger="agentgym.trainer"):
        train(cfg, source=FixedTrajectorySource([trajs]), servers=False, show_progress=False)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    said = "filter_groups (dynamic sampling) is off" in caplog.text
    if distill:
        assert row["episodes"] == 4 and not any(k.startswith("sampling/") for k in row) and said
    else:
        assert row["episodes"] == 2 and row["sampling/flat_group_frac"] == 0.5 and not said


def test_the_clip_bounds_each_tokens_push_but_not_the_metrics():
    adv = torch.zeros(1, 3)
    student, teacher = torch.tensor([[-0.1, -0.1, -3.0]]), torch.tensor([[-20.0, -0.2, -1.0]])
    out, metrics = compute_distillation_advantage(adv, student, teacher, torch.ones(1, 3), env_coef=0.0, clip=2.0)
    assert out.tolist() == [[-2.0, pytest.approx(-0.1), 2.0]]
    assert metrics["distill/reverse_kl"] == pytest.approx((19.9 + 0.1 - 2.0) / 3)
