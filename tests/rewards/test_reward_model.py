"""veRL's reward model (``reward_model.enable``): which logit is the score, the re-rendering with the
reward model's own chat template, how the score meets the env's reward, and a run that trains on it."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentgym.model import load_tokenizer
from agentgym.rewards.reward_model import (
    RewardModelScorer,
    RewardModelSettings,
    RewardModelWorker,
    conversation,
)
from agentgym.rewards.scored_source import ScoredSource
from agentgym.rewards.tiny_rm import build_tiny_reward_model, expected_score, preferred_ids
from agentgym.rollout.sources import FixedTrajectorySource
from agentgym.types import Trajectory, Turn

PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def plain_rm_dir(tmp_path_factory):
    """The same preference, but the model's chat template is bare text, unlike the policy's."""
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm_plain") / "rm", chat_template=PLAIN_TEMPLATE)


def episode(reply: str, content: str | None = None, outcome: float = 0.0, turn_reward: float = 0.0) -> Trajectory:
    """One arithmetic-like turn rendered with the policy's (tiny) template; ``content``: what the
    messages record as the reply (the runner records parsed text; the sampled tokens are the truth)."""
    tok = load_tokenizer("tiny")
    prompt = [{"role": "user", "content": "What is 3 + 4?"}]
    text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    reply_ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    turn = Turn(prompt_ids=prompt_ids, response_ids=reply_ids, logprobs=[-1.0] * len(reply_ids), reward=turn_reward)
    return Trajectory(
        turns=[turn],
        outcome_reward=outcome,
        group_id="g",
        messages=[*prompt, {"role": "assistant", "content": reply if content is None else content}],
    )


def settings(
    path, input_tokenizer: str | None = "tiny", combine: str = "replace", micro: int = 2, max_length: int | None = None
) -> RewardModelSettings:
    return RewardModelSettings(str(path), input_tokenizer, micro, max_length, combine, use_ray=False)


def test_the_score_is_the_logit_at_the_last_valid_token(rm_dir):
    """veRL's convention: the head's output at the row's last attention-mask position, whatever the
    padding around it; a row that ends on the pad token is scored there too (Hugging Face's own pooling
    would skip back to the last non-pad token)."""
    tok = load_tokenizer(str(rm_dir))
    preferred = preferred_ids(tok, list("0123456789"))
    rows = [
        tok("What is 3 + 4? 7", add_special_tokens=False)["input_ids"],
        tok("no digits here at all", add_special_tokens=False)["input_ids"],
        tok("77 7", add_special_tokens=False)["input_ids"] + [tok.pad_token_id] * 3,
    ]
    for micro in (1, 3):
        got = RewardModelWorker(str(rm_dir), micro).score(rows)
        assert got == pytest.approx([expected_score(r, preferred) for r in rows], abs=1e-4)
    assert got[1] == pytest.approx(0.0, abs=1e-6) and got[2] < expected_score(rows[2][:3], preferred)


def test_a_reward_model_with_several_outputs_is_refused(tmp_path):
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from agentgym.config import ConfigError

    AutoModelForSequenceClassification.from_config(
        Qwen2Config(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_labels=2,
            pad_token_id=0,
        )
    ).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="num_labels=1"):
        RewardModelWorker(str(tmp_path), 4)


def test_input_tokenizer_rerenders_the_chat_with_the_reward_models_template(plain_rm_dir):
    """With ``input_tokenizer`` the reward model reads the conversation re-rendered by its own template,
    the reply decoded from the sampled tokens (not the recorded message); with ``null`` it reads the
    policy's tokens as they were sampled. The two give different scores here."""
    traj = episode("7 7", content="(parsed text that the policy did not sample)")
    rm_tok = load_tokenizer(str(plain_rm_dir))
    preferred = preferred_ids(rm_tok, list("0123456789"))
    chat = conversation(traj, load_tokenizer("tiny"))
    assert chat[-1] == {"role": "assistant", "content": "7 7"}
    rendered = rm_tok(rm_tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
    assert rm_tok.decode(rendered) == "What is 3 + 4?\n7 7\n"

    rerendered = RewardModelScorer(settings(plain_rm_dir, "tiny"))
    assert asyncio.run(rerendered.score([traj]))["reward/rm_scored"] == 1
    assert traj.outcome_reward == pytest.approx(expected_score(rendered, preferred), abs=1e-4)

    raw = episode("7 7")
    asyncio.run(RewardModelScorer(settings(plain_rm_dir, None)).score([raw]))
    assert raw.outcome_reward == pytest.approx(expected_score(raw.token_ids(), preferred), abs=1e-4)
    assert traj.outcome_reward > raw.outcome_reward + 0.5  # the bare template dilutes the digits less


def test_rows_longer_than_max_length_keep_their_start_and_are_counted(rm_dir):
    traj = episode("1 2 3 4 5 6 7 8 9")
    scorer = RewardModelScorer(settings(rm_dir, None, max_length=8))
    counts = asyncio.run(scorer.score([traj]))
    assert counts["reward/rm_truncated"] == 1
    preferred = preferred_ids(load_tokenizer(str(rm_dir)), list("0123456789"))
    assert traj.outcome_reward == pytest.approx(expected_score(traj.token_ids()[:8], preferred), abs=1e-4)


def test_the_score_replaces_the_env_reward_as_in_verl_or_adds_to_it(rm_dir):
    """``replace`` (veRL: the reward manager returns the reward model's scores): the score is the whole
    reward, the env's kept in metrics; ``add``: env reward + score. Failed episodes and validation
    episodes are not scored; counts add up over the rounds of a step."""
    ok, failed = episode("7", outcome=1.0, turn_reward=0.5), episode("7", outcome=1.0)
    failed.status = "failed"
    source = ScoredSource(
        FixedTrajectorySource([[ok, failed]], validation=[episode("7", outcome=1.0)]),
        RewardModelScorer(settings(rm_dir, None)),
        "reward_model",
    )
    out = asyncio.run(source.collect(1))
    score = out[0].metrics["model_score"]
    assert score > 0 and out[0].outcome_reward == score and out[0].turns[0].reward == 0.0
    assert out[0].total_reward == score and out[0].metrics["rule_reward"] == 1.5
    assert out[1].outcome_reward == 1.0 and "model_score" not in out[1].metrics
    assert asyncio.run(source.validate())[0].outcome_reward == 1.0
    asyncio.run(source.collect(1))  # a second round of the same step
    assert source.reward_metrics["reward/rm_scored"] == 2
    assert source.reward_metrics["reward/rm_score/mean"] == pytest.approx(score)
    asyncio.run(source.collect(2))
    assert source.reward_metrics["reward/rm_scored"] == 1

    added = episode("7", outcome=1.0, turn_reward=0.5)
    asyncio.run(RewardModelScorer(settings(rm_dir, None, "add")).score([added]))
    assert added.total_reward == pytest.approx(1.5 + added.metrics["model_score"])


@pytest.mark.slow
def test_training_on_arithmetic_follows_the_reward_model(rm_dir, tmp_path):
    """``agentgym train --env arithmetic reward_model.enable=true reward_model.model.path=DIR``: the
    reward model prefers digits; the random tiny model writes one in about 1 reply of 7 and almost
    never a right sum, so the env's own reward is flat and only the reward model's score can teach it.
    Within 8 GRPO steps most replies hold a digit."""
    from agentgym.cli import main

    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--env",
                "arithmetic",
                "reward_model.enable=true",
                f"reward_model.model.path={rm_dir}",
                "warm_start.enable=false",
                "held_out.enable=false",
                "data.train_batch_size=8",
                "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.optim.lr=1e-2",
                "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
                "trainer.total_training_steps=8",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                "trainer.log_samples=64",
                f"trainer.default_local_dir={run}",
                "trainer.logger=[jsonl]",
                "trainer.seed=0",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/rm_scored" in r]
    assert len(steps) == 8 and all(r["reward/rm_scored"] == 64 for r in steps)
    assert all(r["reward/mean"] == pytest.approx(r["reward/rm_score/mean"]) for r in steps)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    rate = {}
    for step in (1, 8):
        replies = ["".join(t["response_text"] for t in s["turns"]) for s in samples if s["step"] == step]
        rate[step] = sum(any(c.isdigit() for c in r) for r in replies) / len(replies)
    # measured over 11 runs on one machine: 0.09-0.22 at step 1, 0.78-1.0 at step 8 (sampling is unseeded)
    assert rate[1] < 0.4 and rate[8] > 0.6 and rate[8] - rate[1] > 0.4, rate


@pytest.mark.slow
def test_with_ray_the_reward_model_and_the_teacher_are_actors_of_their_own(rm_dir):
    """``trainer.use_ray``: the reward model and a distillation teacher score in Ray actors, with the
    same numbers as in this process."""
    import ray

    from agentgym.rewards.teacher import TeacherScorer, TeacherSettings

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:

        async def both(use_ray: bool) -> tuple[list[float], list[list[float]]]:
            trajs = [episode("7 1"), episode("no digits")]
            rm = RewardModelScorer(RewardModelSettings(str(rm_dir), "tiny", 2, None, "replace", use_ray))
            teacher = TeacherScorer(TeacherSettings("tiny", (), "vllm", None, None, 2, 4, 10.0, 1, use_ray), "tiny")
            try:
                await rm.score(trajs)
                await teacher.score(trajs)
            finally:
                await rm.aclose()
                await teacher.aclose()
            assert all(len(t.turns[0].teacher_logprobs) == len(t.turns[0].response_ids) for t in trajs)
            return [t.outcome_reward for t in trajs], [t.turns[0].teacher_logprobs for t in trajs]

        remote, local = asyncio.run(both(True)), asyncio.run(both(False))
        assert remote[0] == pytest.approx(local[0], abs=1e-5) and remote[0][0] > 0
        assert remote[1] == [pytest.approx(v, abs=1e-5) for v in local[1]]
    finally:
        if started:
            ray.shutdown()


def test_a_trajectory_the_reward_model_cannot_read_is_kept_out_not_scored(rm_dir):
    """Re-rendering needs the conversation; one recorded without messages is refused (kept, not trained
    on, counted), and the others of the step are scored."""
    bare, fine = episode("7"), episode("7")
    bare.messages = []
    counts = asyncio.run(RewardModelScorer(settings(rm_dir, "tiny")).score([bare, fine]))
    assert bare.status == "failed" and "no messages to re-render" in bare.failure and bare.outcome_reward == 0.0
    assert fine.metrics["model_score"] > 0
    assert counts["reward/rm_unreadable"] == 1 and counts["reward/rm_scored"] == 1
