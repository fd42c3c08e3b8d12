"""``agentgym sft`` with veRL's ``fsdp_sft_trainer`` keys: a prompt column that is not text is refused (never
trained on as ``str(dict)``), dict keys pick the text, veRL's other keys are understood or noted, LoRA trains
adapters only."""

from __future__ import annotations

import json
import logging

import pytest

from agentgym.model import load_tokenizer
from agentgym.rollout.chat import ChatTokenizer
from agentgym.stages.sft import load_sft_config
from agentgym.stages.sft_data import SFTDataError, conversation, load_sft_trajectories

ROW = {
    "extra_info": {"question": "3 + 4 = ?", "answer": "7", "split": "train"},
    "data_source": "openai/gsm8k",
    "_where": "train.jsonl line 1",
}


def test_a_dict_prompt_column_is_refused_with_the_key_that_picks_its_text():
    with pytest.raises(SFTDataError, match=r"a dict, not text.*prompt_dict_keys=\[question\]"):
        conversation(ROW, prompt_key="extra_info", response_key="extra_info")


def test_dict_keys_pick_the_text():
    messages = conversation(
        ROW,
        prompt_key="extra_info",
        response_key="extra_info",
        prompt_dict_keys=["question"],
        response_dict_keys=["answer"],
    )
    assert messages == [{"role": "user", "content": "3 + 4 = ?"}, {"role": "assistant", "content": "7"}]
    with pytest.raises(SFTDataError, match="names 'questions' under extra_info"):
        conversation(
            ROW,
            prompt_key="extra_info",
            response_key="extra_info",
            prompt_dict_keys=["questions"],
            response_dict_keys=["answer"],
        )
    with pytest.raises(SFTDataError, match="response at extra_info is a dict"):
        conversation(ROW, prompt_key="extra_info", response_key="extra_info", prompt_dict_keys=["question"])


def test_json_text_in_a_parquet_column_is_read_through(tmp_path):
    row = {"extra_info": json.dumps(ROW["extra_info"]), "_where": "r"}
    messages = conversation(
        row,
        prompt_key="extra_info",
        response_key="extra_info",
        prompt_dict_keys=["question"],
        response_dict_keys=["answer"],
    )
    assert messages[-1]["content"] == "7"


def test_verl_sft_command_line_keys_load_with_notes(caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.trainer"):
        cfg = load_sft_config(
            overrides=[
                "data.train_files=x.jsonl",
                "data.prompt_key=extra_info",
                "data.response_key=extra_info",
                "data.prompt_dict_keys=['question']",
                "+data.response_dict_keys=['answer']",
                "data.micro_batch_size=4",
                "model.lora_rank=32",
                "model.lora_alpha=16",
                "model.target_modules=all-linear",
                "ulysses_sequence_parallel_size=2",
                "use_remove_padding=true",
                "model.fsdp_config.model_dtype=fp32",
                "model.strategy=fsdp",
                "optim.lr_warmup_steps_ratio=0.1",
                "data.train_max_samples=10",
            ]
        )
    assert list(cfg.data.prompt_dict_keys) == ["question"] and list(cfg.data.response_dict_keys) == ["answer"]
    assert cfg.data.micro_batch_size_per_gpu == 4 and cfg.optim.warmup_steps_ratio == 0.1  # veRL's other names
    assert cfg.model.lora_rank == 32 and cfg.model.target_modules is None and cfg.model.strategy == "auto"
    noted = caplog.text
    assert "ulysses_sequence_parallel_size" in noted and "use_remove_padding" in noted
    assert "model.fsdp_config.model_dtype" in noted


def test_a_typo_among_verl_sft_keys_is_still_an_error():
    from agentgym.config import ConfigError

    with pytest.raises(ConfigError, match="data.prompt_dict_keys"):
        load_sft_config(overrides=["data.train_files=x.jsonl", "data.prompt_dict_key=['q']"])


def test_max_samples_and_json_lines_in_a_json_file(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("".join(json.dumps({"q": f"{i} + 1 = ?", "a": str(i + 1)}) + "\n" for i in range(6)))
    chat = ChatTokenizer(load_tokenizer("tiny"))
    trajs, _ = load_sft_trajectories(str(path), chat, prompt_key="q", response_key="a", max_samples=4)
    assert len(trajs) == 4


def test_lora_sft_trains_adapters_and_writes_a_whole_model(tmp_path):
    from agentgym.cli import main
    from agentgym.model import load_causal_lm

    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"extra_info": {"question": f"{i} + 2 = ?", "answer": str(i + 2)}}) + "\n" for i in range(8))
    )
    out = tmp_path / "run"
    code = main(
        [
            "sft",
            f"data.train_files={data}",
            "data.prompt_key=extra_info",
            "data.response_key=extra_info",
            "data.prompt_dict_keys=[question]",
            "+data.response_dict_keys=[answer]",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=4",
            "model.partial_pretrain=tiny",
            "model.lora_rank=4",
            "model.target_modules=all-linear",
            "trainer.total_training_steps=1",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={out}",
            "optim.lr=1e-2",
        ]
    )
    assert code == 0
    base, tuned = load_causal_lm("tiny"), load_causal_lm(str(out / "huggingface"))
    changed = [n for n, p in tuned.state_dict().items() if not p.equal(base.state_dict()[n])]
    assert changed and all("proj" in n or "mlp" in n for n in changed)  # adapters merged into linear layers only
    assert not any("embed" in n or "norm" in n for n in changed)


def test_missing_packages_are_named_before_any_work(monkeypatch):
    from agentgym import preflight
    from agentgym.config import ConfigError

    monkeypatch.setattr(preflight, "_importable", lambda module: module != "peft")
    with pytest.raises(ConfigError, match="model.lora_rank=8: pip install peft"):
        load_sft_config(overrides=["data.train_files=x.jsonl", "model.lora_rank=8"])
