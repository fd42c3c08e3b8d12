"""``agentgym sft``: the data is tokenized as a rollout would be, the loss falls on assistant tokens
only, and RL starts from exactly the weights SFT wrote."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from agentgym.cli import main
from agentgym.model import load_tokenizer, resolve_model_path
from agentgym.rollout.chat import ChatTokenizer
from agentgym.stages.sft import SFTTrainer, load_sft_config
from agentgym.stages.sft_data import SFTDataError, load_sft_trajectories, to_trajectory

CONVERSATION = [
    {"role": "system", "content": "Answer with the number."},
    {"role": "user", "content": "3 + 4 = ?"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Double it."},
    {"role": "tool", "content": "(no tool here)", "tool_call_id": "x"},
    {"role": "assistant", "content": "14"},
]


def write_chats(path, count=64, env=None):
    with open(path, "w") as f:
        for i in range(count):
            a, b = i % 9 + 1, i % 7 + 2
            msgs = [
                {"role": "user", "content": f"{a} + {b} = ?"},
                {"role": "assistant", "content": str(a + b)},
                {"role": "user", "content": "Double it."},
                {"role": "assistant", "content": str(2 * (a + b))},
            ]
            f.write(json.dumps({"messages": msgs, **({"env": env} if env else {})}) + "\n")
    return path


def test_the_mask_covers_exactly_the_assistant_tokens_of_every_turn():
    chat = ChatTokenizer(load_tokenizer("tiny"))
    traj = to_trajectory(CONVERSATION, chat)
    ids, mask = traj.token_ids(), traj.loss_mask()
    rendered = chat.render(CONVERSATION)
    assert chat.decode(ids) + "\n" == rendered  # the whole conversation, as the template writes it
    trained = [chat.decode([t for t, m in zip(turn_ids, turn_mask) if m]) for turn_ids, turn_mask in [(ids, mask)]][0]
    assert trained == "7<|im_end|>14<|im_end|>"
    assert len(traj.turns) == 2 and all(t.response_ids[-1] == chat.closing_id for t in traj.turns)
    # a rollout of the same conversation builds the same sequence: prompt, reply, delta, reply
    first = chat.prompt_ids(CONVERSATION[:2])
    assert traj.turns[0].prompt_ids == first
    assert traj.turns[1].prompt_ids == chat.delta_ids(CONVERSATION[3:5], None, chat.closing_id)


def test_single_turn_prompt_and_response_keys(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "2 + 2?", "answer": "4"}) + "\n")
    chat = ChatTokenizer(load_tokenizer("tiny"))
    (traj,), skipped = load_sft_trajectories(str(path), chat, prompt_key="question", response_key="answer")
    assert skipped == 0 and traj.turns[0].response_text == "4<|im_end|>"


@pytest.mark.parametrize(
    "row, message",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        ({"messages": "not a list"}, "must hold a list of chat messages"),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "env": "gsm8k"},
            "demos --env sokoban",
        ),
    ],
)
def test_bad_data_is_refused_before_any_work(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises((SFTDataError, ValueError), match=message):
        load_sft_trajectories(str(path), ChatTokenizer(load_tokenizer("tiny")), expect_env="sokoban")


def test_command_line_errors_name_the_fix(tmp_path, capsys):
    assert main(["sft"]) == 2
    assert "data.train_files" in capsys.readouterr().err
    assert main(["sft", f"data.train_files={tmp_path}/missing.jsonl"]) == 2
    assert "no data at" in capsys.readouterr().err
    model = tmp_path / "no-template"
    shutil.copytree(resolve_model_path("tiny"), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in model.glob("chat_template.*"):
        extra.unlink()
    data = write_chats(tmp_path / "chats.jsonl", 8)
    assert main(["sft", f"data.train_files={data}", f"model.partial_pretrain={model}"]) == 2
    assert "chat_template" in capsys.readouterr().err


def test_sft_learns_and_rl_starts_from_its_weights(tmp_path):
    from agentgym.trainer.forward import policy_forward
    from agentgym.trainer.worker_group import WorkerGroup
    from agentgym.trainer.workers import PolicyWorker

    data = write_chats(tmp_path / "chats.jsonl", 64)
    cfg = load_sft_config(
        overrides=[
            f"data.train_files={data}",
            f"data.val_files={data}",
            "data.val_batch_size=16",
            "data.train_batch_size=16",
            "data.micro_batch_size_per_gpu=8",
            "trainer.total_training_steps=12",
            "optim.lr=3e-3",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.logger=[jsonl]",
        ]
    )
    trainer = SFTTrainer(cfg, show_progress=False)
    trainer.init_workers()
    before = trainer.validate()["val/sft/loss"]
    summary = trainer.fit()
    after = summary["val_metrics"]["val/sft/loss"]
    assert summary["steps"] == 12 and after < before - 0.5, (before, after)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13)) and rows[-1]["sft/loss"] < rows[0]["sft/loss"]

    # RL's actor loads the exported model: its log-probs at step 0 are SFT's, to the bit
    from agentgym.trainer.batch import build_batch

    batch, _ = build_batch(trainer.val_set[:4], trainer.pad_token_id)
    sft_model = trainer.actor.workers[0].actor.module
    with torch.no_grad():
        sft_lp, _ = policy_forward(sft_model.eval(), batch.tensors)
    from agentgym.trainer.config import load_config

    rl_config = load_config(overrides=[f"actor_rollout_ref.model.path={summary['hf_model']}", "trainer.device=cpu"])
    rl = WorkerGroup(PolicyWorker, rl_config, 1, False)
    rl.call("init_model", 1, False)
    with torch.no_grad():
        rl_lp, _ = policy_forward(rl.workers[0].actor.module.eval(), batch.tensors)
    assert torch.equal(sft_lp, rl_lp)
    trainer.shutdown()
    rl.shutdown()
