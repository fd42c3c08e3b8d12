"""LoRA with veRL's keys (actor_rollout_ref.model.lora_rank / lora_alpha / target_modules) through peft:
only adapters train, pushes and checkpoints carry only adapters, the reference is the base with
adapters off, servers (the embedded engine; vLLM through its adapter routes) serve what the
trainer computes, and a LoRA run learns first_letter."""

from __future__ import annotations

import asyncio
import importlib.util
import json

import httpx
import pytest
import torch

pytestmark = [
    pytest.mark.lora,
    pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install 'agentgym[lora]'"),
]

from agentgym.model import (  # noqa: E402
    load_causal_lm,
    load_tokenizer,
    lora,  # noqa: E402
)
from agentgym.server.engine import Engine  # noqa: E402
from agentgym.server.sampling import GenerationParams  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = list(range(5, 30))


def wrapped(rank=8, alpha=16, targets="all-linear", seed=0):
    model = lora.wrap(load_causal_lm("tiny").train(), lora.LoraSettings(rank, alpha, targets))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # adapters as after some training (B starts at zero); at 0.5 (not 0.1) the
        for name, p in model.named_parameters():  # logits reach ~30 and float32 rounding alone exceeds 1e-4
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def logprobs(model, prompt, tokens):
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def test_only_adapters_train_and_checkpoints_hold_only_adapters(tmp_path):
    model = wrapped()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2 * len(ALL)  # A and B, 7 modules, 2 layers
    state = model.state_dict()
    assert set(state) == set(trainable)
    torch.save(state, tmp_path / "model.pt")
    fresh = lora.wrap(load_causal_lm("tiny"), lora.LoraSettings(8, 16, "all-linear")).eval()
    fresh.load_state_dict(torch.load(tmp_path / "model.pt"))  # strict: the base is not missing
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.allclose(fresh(ids).logits, model(ids).logits, atol=1e-6)


def test_the_pushed_payload_is_the_adapters_only():
    rank = 8
    model = wrapped(rank=rank)
    payload = lora.push_state(model)
    full = {k: v for k, v in load_causal_lm("tiny").state_dict().items() if k != "lm_head.weight"}
    cfg = model.get_base_model().config
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]  # (in, out) per module
    expected = layers * sum(rank * (i + o) for i, o in shapes) * 4
    pushed = sum(v.numel() * v.element_size() for v in payload.values())
    whole = sum(v.numel() * v.element_size() for v in full.values())
    print(
        f"\nLoRA rank {rank} push: {pushed / 1024:.1f} KiB; full push: {whole / 1024:.1f} KiB "
        f"({whole / pushed:.1f}x smaller)"
    )
    assert pushed == expected
    assert set(payload) == {
        f"model.layers.{i}.{part}.{m}.lora_{x}.weight"
        for i in range(layers)
        for part, names in (("self_attn", ALL[:4]), ("mlp", ALL[4:]))
        for m in names
        for x in "AB"
    }


@pytest.mark.parametrize("lean", [True, False], ids=["lean-forward", "merged"])
def test_the_engine_serves_what_the_lora_model_computes(lean):
    engine = Engine(load_causal_lm("tiny"), load_tokenizer("tiny"), max_batch_size=4, lean=lean).start()
    try:
        for version, seed in ((1, 1), (2, 2)):  # a second adapter replaces the first exactly
            model = wrapped(targets=[*ALL, "lm_head"], seed=seed)
            assert engine.update_weights(lora.push_state(model), version).result(timeout=30) == version

            async def go():
                return (await engine.submit(PROMPT, GenerationParams(max_tokens=10, ignore_eos=True)).done)[0]

            seq = asyncio.run(go())
            expected = logprobs(model, PROMPT, seq.output_ids)
            assert max(abs(a - b) for a, b in zip(seq.logprobs, expected)) < 1e-4
            previous = logprobs(wrapped(targets=[*ALL, "lm_head"], seed=seed - 1), PROMPT, seq.output_ids)
            assert (
                max(abs(a - b) for a, b in zip(seq.logprobs, previous)) > 1e-2
            )  # another adapter: the swap is visible
        with torch.no_grad():  # the embeddings the head was tied to are untouched
            assert torch.equal(engine.model.model.embed_tokens.weight, load_causal_lm("tiny").model.embed_tokens.weight)
    finally:
        engine.stop()


def policy_worker(tmp_path, **model_keys):

    from agentgym.trainer.config import load_config
    from agentgym.trainer.workers import PolicyWorker

    overrides = [f"actor_rollout_ref.model.{k}={v}" for k, v in model_keys.items()]
    cfg = load_config(env="first_letter", overrides=[f"trainer.default_local_dir={tmp_path}", *overrides])
    worker = PolicyWorker(cfg)
    worker.init_model(total_steps=2, with_ref=True)
    return worker


def test_the_reference_is_the_base_with_adapters_off_and_exports(tmp_path):
    worker = policy_worker(tmp_path, lora_rank=4, lora_alpha=8)
    assert worker.ref is None  # no second copy of the weights
    with torch.no_grad():
        for name, p in worker.actor.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.tensor([PROMPT + [7, 8, 9]])
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "prompt_lengths": torch.tensor([len(PROMPT)]),
        "responses": torch.tensor([[7, 8, 9]]),
        "response_mask": torch.ones(1, 3),
    }
    ref = worker.compute_ref_log_prob(batch, [0])["ref_log_prob"][0].tolist()
    now = worker.compute_log_prob(batch, [0])["old_log_probs"][0].tolist()
    base = logprobs(load_causal_lm("tiny"), PROMPT, [7, 8, 9])
    assert max(abs(a - b) for a, b in zip(ref, base)) < 1e-5
    assert max(abs(a - b) for a, b in zip(now, base)) > 1e-3
    # HF export: peft's adapter directory, or the merged model on request
    worker.save_hf(str(tmp_path / "adapter"))
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(load_causal_lm("tiny"), str(tmp_path / "adapter")).eval()
    assert max(abs(a - b) for a, b in zip(logprobs(reloaded, PROMPT, [7, 8, 9]), now)) < 1e-5
    worker.config["actor_rollout_ref"]["model"]["lora_export_merged"] = True
    worker.save_hf(str(tmp_path / "merged"))
    merged = load_causal_lm(str(tmp_path / "merged"))
    assert max(abs(a - b) for a, b in zip(logprobs(merged, PROMPT, [7, 8, 9]), now)) < 1e-4


def test_vllm_servers_hot_load_the_adapter_directory(tmp_path):
    """Against a stand-in that checks vLLM's documented routes and fields."""
    from agentgym.client.weights import VLLMWeights

    calls = []
    loaded: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        calls.append((request.url.path, body))
        if request.url.path == "/v1/load_lora_adapter":
            if set(body) != {"lora_name", "lora_path"} or body["lora_name"] in loaded:
                return httpx.Response(400, json={"error": f"bad request or {body.get('lora_name')} already loaded"})
            assert (tmp_path / "adapter" / "adapter_config.json").exists()
            loaded[body["lora_name"]] = body["lora_path"]
            return httpx.Response(200, text="Success: LoRA adapter loaded")
        if request.url.path == "/v1/unload_lora_adapter":
            if loaded.pop(body.get("lora_name"), None) is None:
                return httpx.Response(404, json={"error": "not found"})
            return httpx.Response(200, text="Success")
        return httpx.Response(404)

    lora.save_adapter(wrapped(rank=4), str(tmp_path / "adapter"), "tiny")
    weights = VLLMWeights(transport=httpx.MockTransport(handler))
    for version in (1, 2):  # the second push replaces the adapter under the same name
        weights.load_lora_adapter("http://vllm", "agentgym-lora", str(tmp_path / "adapter"), version)
    assert loaded == {"agentgym-lora": str(tmp_path / "adapter")}
    paths = [p for p, _ in calls if "lora" in p]
    assert paths == ["/v1/unload_lora_adapter", "/v1/load_lora_adapter"] * 2
    assert VLLMWeights.lora_args(4) == ["--enable-lora", "--max-lora-rank", "4"]


@pytest.mark.slow
def test_a_lora_run_learns_first_letter(tmp_path):
    """The statistical check of tests/trainer/test_trainer.py::test_grpo_learns_first_letter, with LoRA
    adapters only. The head is among the targets: the random tiny model's output passes through
    embeddings of norm ~0.16 tied to its head, which adapters on the inner layers alone can
    barely turn towards vowels (measured: 0.19 -> 0.21 after 15 direct gradient steps; with the
    head adapted, 0.99)."""
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    targets = "[" + ",".join([*ALL, "lm_head"]) + "]"
    cfg = load_config(
        env="first_letter",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "trainer.seed=0",
            "trainer.total_training_steps=15",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.use_ray=false",
            "actor_rollout_ref.rollout.sampling_seed=1234",  # unseeded, a CI run fell short (0.26 -> 0.46)
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=16",
            f"actor_rollout_ref.model.target_modules={targets}",
        ],
    )
    summary = train(cfg, show_progress=False)
    with open(summary["metrics_file"]) as f:
        rows = [json.loads(line) for line in f]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(rewards) == 15
    before, after = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
    assert before < 0.4 and after - before > 0.25, rewards
    pushed = [r["weight_sync/mb"] for r in rows if "weight_sync/mb" in r]
    full_mb = (
        sum(v.numel() * 4 for k, v in load_causal_lm("tiny").state_dict().items() if k != "lm_head.weight") / 2**20
    )
    assert pushed and max(pushed) < full_mb / 2  # adapters only
    assert rows[-1]["training/rollout_probs_diff_mean"] < 1e-3  # the server applies what the trainer trains
