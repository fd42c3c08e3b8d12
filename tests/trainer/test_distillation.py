"""On-policy distillation (``distillation.*``): the teacher scores exactly the sampled tokens with their
whole context, by a worker here or by vLLM / SGLang servers, a teacher with another tokenizer is
refused, and the trainer adds the per-token reverse KL to the advantages."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from agentgym.config import ConfigError
from agentgym.model import load_causal_lm, tiny_model_path
from agentgym.rewards.teacher import TeacherScorer, TeacherSettings, TeacherWorker, check_tokenizers
from agentgym.trainer.algos.distill import compute_distillation_advantage
from agentgym.trainer.batch import build_batch
from agentgym.trainer.distillation import teacher_log_probs, teacher_topk
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


def full_forward_topk(traj: Trajectory, k: int) -> list[tuple[list[list[int]], list[list[float]]]]:
    """Per turn, the tiny model's k most likely tokens and their logprobs at each sampled position."""
    model = tiny_lm()
    ids = torch.tensor([traj.token_ids()])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0]
    out, pos = [], 0
    for turn in traj.turns:
        pos += len(turn.prompt_ids)
        values, top = logp[pos - 1 : pos - 1 + len(turn.response_ids)].topk(k, -1)
        out.append((top.tolist(), values.tolist()))
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


def test_the_teacher_gives_its_top_k_tokens_at_each_sampled_position():
    trajs = [episode(1), episode(2, turns=3)]
    asyncio.run(TeacherScorer(settings(topk=4), "tiny").score(trajs))
    for traj in trajs:
        for turn, values, (top, top_values) in zip(
            traj.turns, full_forward_logprobs(traj), full_forward_topk(traj, 4), strict=True
        ):
            assert turn.teacher_logprobs == pytest.approx(values, abs=1e-4)  # the sampled tokens as before
            assert turn.teacher_topk_ids == top and len(turn.teacher_topk_ids) == len(turn.response_ids)
            for row, expected in zip(turn.teacher_topk_logprobs, top_values, strict=True):
                assert row == pytest.approx(expected, abs=1e-4) and row == sorted(row, reverse=True)


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
    with pytest.raises(ConfigError, match="loss_mode=topk needs distillation.topk >= 1"):
        load_config(
            env="first_letter",
            overrides=[
                "distillation.enable=true",
                "distillation.teacher.path=tiny",
                "distillation.loss_mode=topk",
                "distillation.topk=0",
            ],
            warn=False,
        )
    with pytest.raises(ConfigError, match="needs distillation.teacher.tokenizer"):
        load_config(
            env="first_letter",
            overrides=["distillation.enable=true", "distillation.teacher.server_urls=[http://x:1]"],
            warn=False,
        )
    teacher = ["distillation.enable=true", "distillation.teacher.path=tiny"]
    with pytest.raises(ConfigError, match=r"GKD's beta lies in \[0, 1\]"):
        load_config(env="first_letter", overrides=[*teacher, "distillation.loss_mode=topk", "distillation.beta=1.5"])
    with pytest.raises(ConfigError, match="set distillation.loss_mode=topk, or leave beta at 1"):
        load_config(env="first_letter", overrides=[*teacher, "distillation.beta=0"], warn=False)


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
                    k = int(request.get("prompt_logprobs") or request.get("top_logprobs_num") or 0)
                    scores = outer.worker.scores([ids], [list(range(1, len(ids)))], k)[0]
                values = scores.logprobs
                tops = scores.topk_ids or [[] for _ in values]
                top_values = scores.topk_logprobs or [[] for _ in values]
                if self.path == "/v1/completions":  # the prompt's token, then the top-k (vLLM's layout)
                    table = [None]
                    for t, v, top, top_v in zip(ids[1:], values, tops, top_values, strict=True):
                        entry = {str(t): {"logprob": v, "rank": 99}}
                        entry.update(
                            {str(a): {"logprob": b, "rank": r + 1} for r, (a, b) in enumerate(zip(top, top_v))}
                        )
                        table.append(entry)
                    self._send(200, {"choices": [{"text": "", "prompt_logprobs": table}]})
                else:
                    table = [[None, ids[0], None]] + [[v, t, None] for t, v in zip(ids[1:], values, strict=True)]
                    meta = {"input_token_logprobs": table}
                    if k:  # shuffled order: the client sorts
                        meta["input_top_logprobs"] = [None] + [
                            [[b, a, None] for a, b in reversed(list(zip(top, top_v)))]
                            for top, top_v in zip(tops, top_values, strict=True)
                        ]
                    self._send(200, {"text": "", "meta_info": meta})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("topk", [0, 3])
@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_a_teacher_on_servers_gives_the_same_logprobs_and_retries_failures(backend, topk):
    server = StandinTeacherServer(fail_first=2)
    try:
        trajs = [episode(4), episode(5)]
        scorer = TeacherScorer(
            settings(path=None, server_urls=(server.url,), backend=backend, tokenizer="tiny", topk=topk), "tiny"
        )
        counts = asyncio.run(scorer.score(trajs))
    finally:
        server.stop()
    assert counts["distill/teacher_errors"] == 0
    for traj in trajs:
        expected_top = full_forward_topk(traj, topk) if topk else None
        for t, (turn, values) in enumerate(zip(traj.turns, full_forward_logprobs(traj), strict=True)):
            assert turn.teacher_logprobs == pytest.approx(values, abs=1e-4)
            if topk:
                assert turn.teacher_topk_ids == expected_top[t][0]
                assert sum(turn.teacher_topk_logprobs, []) == pytest.approx(sum(expected_top[t][1], []), abs=1e-4)
            else:
                assert turn.teacher_topk_ids == [] and turn.teacher_topk_logprobs == []


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


def one_group_run(overrides: list[str], tmp_path, steps: int):
    """first_letter's config for a short in-process run on fixed trajectories: one group of two, ``steps``
    steps, metrics to ``tmp_path``, no validation, checkpoints or HF export; ``overrides`` on top."""
    from agentgym.trainer.config import load_config

    return load_config(
        env="first_letter",
        overrides=[
            *overrides,
            "trainer.use_ray=false",
            f"trainer.total_training_steps={steps}",
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


@pytest.mark.parametrize("enable", [True, False])
def test_a_trainer_step_learns_from_the_teacher_when_every_env_reward_is_equal(tmp_path, enable):
    """Every episode scored 0 by the env: GRPO's advantages are all 0 and the step is flat. With
    distillation the teacher's per-token advantages remain (teacher logprob -1 on every sampled token,
    the student's -6: +5 each) and the step is not counted flat."""
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.trainer.ppo_trainer import PPOTrainer

    trajs = [episode(10 + i, group=f"g{i // 2}") for i in range(4)]
    for traj in trajs:
        for turn in traj.turns:
            turn.teacher_logprobs = [-1.0] * len(turn.response_ids)
    cfg = one_group_run(
        [
            f"distillation.enable={str(enable).lower()}",
            "distillation.teacher.path=tiny",
            "distillation.env_coef=0",
        ],
        tmp_path,
        steps=1,
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
    from agentgym.trainer.run import train

    trajs = [episode(20 + i, group=f"g{i // 2}") for i in range(4)]
    trajs[3].outcome_reward = 1.0
    cfg = one_group_run(
        [
            f"distillation.enable={str(distill).lower()}",
            "distillation.teacher.path=tiny",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.max_num_gen_batches=1",
        ],
        tmp_path,
        steps=1,
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


# ---- the top-k form -----------------------------------------------------------------------------------
def test_topk_reverse_kl_is_zero_with_zero_gradient_when_the_teacher_is_the_student():
    from agentgym.trainer.algos.distill import student_on_teacher_support, topk_reverse_kl

    logits = torch.randn(2, 5, 50, generator=torch.Generator().manual_seed(0)).requires_grad_()
    teacher_values, ids = torch.log_softmax(logits.detach(), -1).topk(8, -1)
    student, _ = student_on_teacher_support(logits, ids)
    kl = topk_reverse_kl(student, teacher_values)
    kl.sum().backward()
    assert kl.abs().max() < 1e-6 and logits.grad.abs().max() < 1e-6
    other = torch.log_softmax(torch.randn(2, 5, 50, generator=torch.Generator().manual_seed(1)), -1).gather(
        -1, ids
    )  # another teacher: a positive KL
    assert float(topk_reverse_kl(student.detach(), other).min()) > 0


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_gkd_divergences_vanish_only_when_the_teacher_is_the_student(beta):
    from agentgym.trainer.algos.distill import student_on_teacher_support, topk_generalized_jsd

    logits = torch.randn(2, 5, 50, generator=torch.Generator().manual_seed(0)).requires_grad_()
    teacher_values, ids = torch.log_softmax(logits.detach(), -1).topk(8, -1)
    student, _ = student_on_teacher_support(logits, ids)
    jsd = topk_generalized_jsd(student, teacher_values, beta)
    jsd.sum().backward()
    assert jsd.abs().max() < 1e-6 and logits.grad.abs().max() < 1e-6
    other = torch.log_softmax(torch.randn(2, 5, 50, generator=torch.Generator().manual_seed(1)), -1).gather(-1, ids)
    assert float(topk_generalized_jsd(student.detach(), other, beta).min()) > 0


def test_gkd_beta_runs_from_the_forward_kl_to_the_reverse_kl():
    from agentgym.trainer.algos.distill import topk_generalized_jsd, topk_reverse_kl, with_tail

    gen = torch.Generator().manual_seed(2)
    ids = torch.arange(6).expand(3, 6)
    student = torch.log_softmax(torch.randn(3, 20, generator=gen), -1).gather(-1, ids)
    teacher = torch.log_softmax(3 * torch.randn(3, 20, generator=gen), -1).gather(-1, ids)
    s, t = with_tail(student, 1e-6), with_tail(teacher, 1e-6)
    forward = (t.exp() * (t - s)).sum(-1)
    assert torch.allclose(topk_generalized_jsd(student, teacher, 0.0), forward)
    assert torch.allclose(topk_generalized_jsd(student, teacher, 1.0), topk_reverse_kl(student, teacher))
    # scaled by beta * (1 - beta), the JSD tends to each end: the two ends are the limits, not other losses
    for beta, end in ((1e-4, forward), (1 - 1e-4, topk_reverse_kl(student, teacher))):
        scaled = topk_generalized_jsd(student.double(), teacher.double(), beta) / (beta * (1 - beta))
        assert torch.allclose(scaled.float(), end, rtol=1e-2)
    assert not torch.allclose(forward, topk_reverse_kl(student, teacher), rtol=0.1)


def topk_setup(seed: int = 30):
    """Two episodes in a batch (prompt, sampled tokens, env tokens, sampled tokens), a teacher whose top-3
    at every sampled position is tokens 5, 6, 7 with probabilities 0.8, 0.1, 0.05 (a token the tiny student
    does not favour), and the second turn of the second episode left unscored."""
    trajs = [episode(seed), episode(seed + 1)]
    for traj in trajs:
        for turn in traj.turns:
            n = len(turn.response_ids)
            turn.teacher_logprobs = [-1.0] * n
            turn.teacher_topk_ids = [[5, 6, 7]] * n
            turn.teacher_topk_logprobs = [[math.log(0.8), math.log(0.1), math.log(0.05)]] * n
    trajs[1].turns[1].teacher_topk_ids, trajs[1].turns[1].teacher_topk_logprobs = [], []
    batch, _ = build_batch(trajs, pad_token_id=0)
    ids, values, scored = teacher_topk(trajs, batch, 3)
    batch["teacher_topk_ids"], batch["teacher_topk_log_probs"], batch["distill_mask"] = ids, values, scored
    return trajs, batch


class _Self:
    """What ``PolicyWorker.distill_loss`` reads of its worker: the config."""

    def __init__(self, loss_mode: str = "topk", beta: float = 1.0) -> None:
        from omegaconf import OmegaConf

        self.config = OmegaConf.create(
            {
                "distillation": {"loss_mode": loss_mode, "kl_coef": 1.0, "beta": beta},
                "actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}},
            }
        )


def _distill_loss(model, batch, loss_mode: str = "topk", beta: float = 1.0):
    from agentgym.trainer.forward import policy_forward
    from agentgym.trainer.workers import PolicyWorker

    aux: dict = {}
    policy_forward(model, batch.tensors, aux=aux)
    metrics: dict = {}
    loss = PolicyWorker.distill_loss(_Self(loss_mode, beta), aux, batch.tensors, {}, metrics)
    return loss, metrics


def test_the_topk_layout_scores_only_sampled_tokens_of_trained_rows():
    trajs, batch = topk_setup()
    mask = batch["response_mask"]
    scored = batch["distill_mask"]
    assert bool((scored <= mask).all())  # never an env token or padding
    assert scored[0].sum() == mask[0].sum() and 0 < scored[1].sum() < mask[1].sum()  # the unscored turn
    assert bool((batch["teacher_topk_ids"][scored.bool()] == torch.tensor([5, 6, 7])).all())
    batch["valid"][1] = False  # a row the trainer does not train
    _, _, untrained = teacher_topk(trajs, batch, 3)
    assert untrained[1].sum() == 0 and untrained[0].sum() == mask[0].sum()


def test_the_topk_loss_ignores_whatever_lies_outside_the_scored_tokens():
    _, batch = topk_setup()
    model = tiny_lm()
    with torch.no_grad():
        base, _ = _distill_loss(model, batch)
        outside = ~batch["distill_mask"].bool()
        batch["teacher_topk_log_probs"][outside] = torch.tensor([-0.01, -9.0, -9.0])
        batch["teacher_topk_ids"][outside] = torch.tensor([11, 12, 13])
        masked, _ = _distill_loss(model, batch)
        assert float(masked) == pytest.approx(float(base), abs=1e-6)
        inside = batch["distill_mask"].bool()
        batch["teacher_topk_log_probs"][inside] = torch.tensor([-0.01, -9.0, -9.0])  # a scored position counts
        assert abs(float(_distill_loss(model, batch)[0]) - float(base)) > 1e-3
        assert float(_distill_loss(model, batch, "sampled")[0]) == 0.0  # sampled: metrics only
        assert abs(float(_distill_loss(model, batch, beta=0.0)[0]) - float(base)) > 1e-3  # beta picks the loss


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_one_topk_step_moves_the_student_towards_the_teachers_tokens(beta):
    _, batch = topk_setup()
    model = load_causal_lm("tiny")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss, before = _distill_loss(model, batch, beta=beta)
    assert before["distill/topk_kl"] > 0.5 and before["distill/greedy_agreement"] < 0.5
    loss.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        _, after = _distill_loss(model, batch, beta=beta)
    # the tiny student's near-uniform 50k-token tail keeps the KL high, but its choice turns to the teacher's
    assert after["distill/topk_kl"] < before["distill/topk_kl"] - 0.02
    assert after["distill/greedy_agreement"] > 0.5 > before["distill/greedy_agreement"]


def test_the_action_tokens_are_those_inside_the_tag():
    from agentgym.model import load_tokenizer
    from agentgym.trainer.distillation import action_mask, action_spans

    assert action_spans(["a<ans", "wer>U", "p</", "answer>"], "answer") == [0.0, 1.0, 1.0, 0.0]
    assert action_spans(["<answer>", "Left", " no close"], "answer") == [0.0, 1.0, 1.0]
    tok = load_tokenizer("tiny")
    reply = tok("I push.<answer>Up || Left</answer> done", add_special_tokens=False)["input_ids"]
    prompt = tok("the board", add_special_tokens=False)["input_ids"]
    traj = Trajectory(
        turns=[
            Turn(prompt_ids=prompt, response_ids=reply, logprobs=[-1.0] * len(reply)),
            Turn(prompt_ids=prompt, response_ids=reply, logprobs=[-1.0] * len(reply)),
        ]
    )
    batch, _ = build_batch([traj], pad_token_id=0)
    action = action_mask([traj], batch, tok, "answer")
    picked = batch["responses"][0][action[0].bool()].tolist()
    assert tok.decode(picked[: len(picked) // 2]).strip() == "Up || Left"  # each turn's action, no tag, no env token
    assert tok.decode(picked).count("Up || Left") == 2 and float(action.sum()) == len(picked)


def test_a_trainer_step_with_the_topk_loss_moves_the_student_towards_the_teacher(tmp_path):
    """``loss_mode=topk`` with ``env_coef=0`` and flat env rewards: the advantages are 0 (the teacher's signal
    is in the loss, not the advantage), the actor's distillation loss is on, and two steps on the same
    episodes lower the top-k KL and raise the agreement with the teacher's greedy token."""
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.trainer.ppo_trainer import PPOTrainer

    trajs, _ = topk_setup(40)
    trajs += topk_setup(42)[0]
    for i, traj in enumerate(trajs):
        traj.group_id = f"g{i // 2}"
    cfg = one_group_run(
        [
            "distillation.enable=true",
            "distillation.teacher.path=tiny",
            "distillation.env_coef=0",
            "distillation.loss_mode=topk",
            "distillation.topk=3",
            "actor_rollout_ref.actor.optim.lr=0.01",
        ],
        tmp_path,
        steps=2,
    )
    trainer = PPOTrainer(cfg, FixedTrajectorySource([trajs]), servers=None, show_progress=False)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    first, second = (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()[-2:])
    assert first["critic/advantages/mean"] == 0.0 and first["actor/distill_loss"] > 0
    assert second["distill/topk_kl"] < first["distill/topk_kl"]
    assert second["distill/greedy_agreement"] > first["distill/greedy_agreement"]
    saved = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])  # k numbers a token stay out
    assert saved["turns"][0]["teacher_logprobs"] and "teacher_topk_ids" not in saved["turns"][0]


def test_the_packed_forward_gives_the_same_view_of_the_teachers_tokens():
    from agentgym.trainer.forward import policy_forward

    _, batch = topk_setup(50)
    model = tiny_lm()
    with torch.no_grad():
        padded, packed = {}, {}
        policy_forward(model, batch.tensors, aux=padded)
        policy_forward(model, batch.tensors, aux=packed, packed=True)
    mask = batch["distill_mask"].bool()
    assert torch.allclose(padded["student_topk_log_probs"][mask], packed["student_topk_log_probs"][mask], atol=1e-4)
    assert torch.equal(padded["student_greedy"][mask], packed["student_greedy"][mask])
