"""A lean forward pass for Llama-family decoders (Llama, Qwen2, Qwen3, Mistral), for the engine.

transformers' modules spend most of a small model's decode step in Python (module calls,
output classes, mask and cache plumbing): for the built-in 2-layer model, well over half of
a step. This is the same arithmetic as those models' ``forward`` (RMSNorm in float32,
rotary embeddings from the model's own rotary module, so every rope variant it knows,
scaled-dot-product attention over the engine's KV cache, the gated MLP), written as plain
tensor calls on the model's own parameters, read at every call, so weight updates (in place
or by rebinding) are seen at once. Its logprobs match a teacher-forced forward of the
transformers model to float rounding (tests/server/test_engine_forward.py).

On a CPU the linear layers run from oneDNN-packed copies of their weights (``packed_linears.py``:
q/k/v and gate/up each as one product), repacked whenever a weight changes.

Models of any other type, or with a feature this does not reproduce (attention or MLP
biases on Llama are fine; anything else unusual is refused by ``supports``), go through the
transformers forward instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from agentgym.server import packed_linears
from agentgym.server.packed_linears import PackedGroup

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def supports(model: Any) -> bool:
    """Whether ``LeanForward`` reproduces ``model``'s forward."""
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED:
        return False
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
        return False
    if getattr(config, "tie_word_embeddings", False) is False and not hasattr(model, "lm_head"):
        return False
    layer = base.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if not all(
        isinstance(m, torch.nn.Linear)
        for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    ):
        return False  # adapters or quantized layers: the module's own forward knows them
    return getattr(config, "pretraining_tp", 1) in (None, 1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: the variance in float32, the weight applied in the input dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanForward:
    """``(ids, positions, masks_by_kind) -> logits of the last column`` over a bound ``SlotKVCache``."""

    def __init__(
        self,
        model: Any,
        kv: Any,
        adapters: dict[Any, Any] | None = None,
        pack: bool | None = None,
        batch_hint: int = 32,
    ) -> None:
        self.model = model
        self.adapters = adapters if adapters is not None else {}  # LoRA: module -> (A, B), see lora_adapters.py
        self.kv = kv
        self.base = model.model
        config = model.config
        self.kinds = list(getattr(config, "layer_types", None) or [])
        self.eps = float(config.rms_norm_eps)
        self.head_dim = kv.head_dim
        self.heads = int(config.num_attention_heads)
        self.kv_heads = kv.kv_heads
        self.groups = self.heads // self.kv_heads
        self.qk_norm = hasattr(self.base.layers[0].self_attn, "q_norm")
        self.act = self.base.layers[0].mlp.act_fn
        head = model.get_output_embeddings()
        if pack is None:
            pack = packed_linears.available(head.weight) and packed_linears.pays(int(config.hidden_size))
        self.packed: list[tuple[PackedGroup, ...]] | None = None
        self.packed_head: PackedGroup | None = None
        if pack:
            self.packed = [
                (
                    PackedGroup([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], batch_hint),
                    PackedGroup([layer.self_attn.o_proj], batch_hint),
                    PackedGroup([layer.mlp.gate_proj, layer.mlp.up_proj], batch_hint),
                    PackedGroup([layer.mlp.down_proj], batch_hint),
                )
                for layer in self.base.layers
            ]
            self.packed_head = PackedGroup([head], batch_hint)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, masks: Any) -> torch.Tensor:
        base = self.base
        b, s = ids.shape
        h = F.embedding(ids, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(h, positions)
        cos, sin = cos[:, None], sin[:, None]
        storage = self.kv.storage
        rows, write_rows, write_cols, length = self.kv._rows, self.kv._write_rows, self.kv._write_cols, self.kv._length
        eps, d = self.eps, self.head_dim
        heads, kv_heads, packed = self.heads, self.kv_heads, self.packed
        for i, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            mask = masks[self.kinds[i]] if isinstance(masks, dict) else masks
            x = rms_norm(h, layer.input_layernorm.weight, eps)
            if packed is not None and not self.qk_norm:  # q and k rotated together, from one q/k/v product
                qkv = packed[i][0](x, self.adapters).view(b, s, heads + 2 * kv_heads, d)
                qk = rotate(qkv[:, :, : heads + kv_heads].transpose(1, 2), cos, sin)
                q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, :, heads + kv_heads :]
            else:
                if packed is not None:
                    q, k, v = packed[i][0](x, self.adapters).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
                    q, k, v = q.view(b, s, heads, d), k.reshape(b, s, kv_heads, d), v.reshape(b, s, kv_heads, d)
                else:
                    q = self.linear(x, attn.q_proj).view(b, s, heads, d)
                    k = self.linear(x, attn.k_proj).view(b, s, kv_heads, d)
                    v = self.linear(x, attn.v_proj).view(b, s, kv_heads, d)
                if self.qk_norm:
                    q = rms_norm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
                    k = rms_norm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
                q = rotate(q.transpose(1, 2), cos, sin)
                k = rotate(k.transpose(1, 2), cos, sin)
            keys, values = storage[0, i], storage[1, i]
            keys[write_rows, :, write_cols] = k.transpose(1, 2).to(keys.dtype)
            values[write_rows, :, write_cols] = v.to(values.dtype)
            keys, values = keys[rows, :, :length], values[rows, :, :length]
            if s == 1 and self.groups > 1:  # one query per row: fold the heads sharing a kv head into queries
                out = F.scaled_dot_product_attention(
                    q.reshape(b, self.kv_heads, self.groups, d), keys, values, attn_mask=mask, scale=attn.scaling
                )
            else:
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=self.groups > 1
                )
            out = out.reshape(b, self.heads, s, d).transpose(1, 2).reshape(b, s, self.heads * d)
            if packed is not None:
                _, o_p, gate_up_p, down_p = packed[i]
                h = h + o_p(out, self.adapters)
                x = rms_norm(h, layer.post_attention_layernorm.weight, eps)
                gate, up = gate_up_p(x, self.adapters).chunk(2, dim=-1)
                h = h + down_p(self.act(gate) * up, self.adapters)
                continue
            h = h + self.linear(out, attn.o_proj)
            x = rms_norm(h, layer.post_attention_layernorm.weight, eps)
            h = h + self.linear(self.act(self.linear(x, mlp.gate_proj)) * self.linear(x, mlp.up_proj), mlp.down_proj)
        h = rms_norm(h[:, -1], base.norm.weight, base.norm.variance_epsilon)
        if self.packed_head is not None:
            return self.packed_head(h, self.adapters)
        return self.linear(h, self.model.get_output_embeddings())

    def linear(self, x: torch.Tensor, module: Any) -> torch.Tensor:
        y = F.linear(x, module.weight, module.bias)
        adapter = self.adapters.get(module) if self.adapters else None
        if adapter is not None:
            y = y + F.linear(F.linear(x, adapter[0]), adapter[1])
        return y
