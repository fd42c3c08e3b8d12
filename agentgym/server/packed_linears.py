"""oneDNN-packed copies of a model's linear weights, for the lean forward on a CPU.

On a CPU, a decode step of a small model is mostly its matrix products (about three quarters
of SmolLM2-135M's step, ``docs/results.md``), and ``F.linear`` on a plain row-major
weight runs them at a fraction of what the core can do for the few-row inputs decoding has.
oneDNN's matmul on a weight reordered once into its blocked layout (what inductor's
``freezing`` does for CPU models) takes a third less time at 8 and 32 rows. The projections
that read the same input are packed as one matrix (q/k/v; gate/up), so a layer is four
products instead of seven.

The packed matrices are copies: each group remembers the address and version counter of the
weights (and biases) it packed and packs again when any of them changed (an in-place
update bumps the counter, a rebind changes the address), so weight pushes, LoRA merges and a
trainer sharing the model's tensors are seen at the next step, as with the plain weights.
The copies cost as much memory as the packed weights (a 135M model: about 0.5 GB more).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

MIN_HIDDEN = 512  # a packed product costs ~13 us more per call: below this width F.linear wins at few rows


def pays(hidden_size: int) -> bool:
    """Whether packing pays for a model this wide (measured on AVX-512: at hidden 512 packed products
    take 15% less time at 1 row, 25% less at 32; at hidden 64, 2-5x more)."""
    return hidden_size >= MIN_HIDDEN


def available(weight: torch.Tensor) -> bool:
    """Whether this torch can pack ``weight`` (a CPU float32 or bfloat16 tensor, oneDNN built in)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter: its address still tells a rebind
        return None


class PackedGroup:
    """Linear modules that read the same input, as one packed product; ``sizes``: each one's outputs."""

    def __init__(self, modules: list[Any], batch_hint: int) -> None:
        self.modules = modules
        self.batch_hint = batch_hint
        self.sizes = [m.weight.shape[0] for m in modules]
        self._seen: list[tuple[Any, str, torch.Tensor, int, int | None]] = []  # what was packed
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def stale(self) -> bool:
        """Whether a weight or bias changed since the last pack: the module holds another tensor, or the
        same one with new storage (``.data`` rebound) or an in-place update (its version counter moved).
        Checked at every call, so it is kept to attribute lookups."""
        if not self._seen:
            return True
        for params, name, tensor, address, version in self._seen:
            now = params[name]
            if now is not tensor or now.data_ptr() != address or (version is not None and now._version != version):
                return True
        return False

    def pack(self) -> None:
        weights = [m.weight for m in self.modules]
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        self._weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.batch_hint)
        biases = [m.bias for m in self.modules]
        if all(b is None for b in biases):
            self._bias = None
        else:
            self._bias = torch.cat(
                [b.detach() if b is not None else weights[0].new_zeros(n) for b, n in zip(biases, self.sizes)]
            )
        self._seen = [
            (m._parameters, name, t, t.data_ptr(), _version(t))
            for m in self.modules
            for name in ("weight", "bias")
            if (t := m._parameters.get(name)) is not None
        ]

    def __call__(self, x: torch.Tensor, adapters: dict[Any, Any] | None = None) -> torch.Tensor:
        if self.stale():
            self.pack()
        y = torch.ops.mkldnn._linear_pointwise(x, self._weight, self._bias, "none", [], "")
        if adapters:
            offset = 0
            for module, n in zip(self.modules, self.sizes):
                pair = adapters.get(module)
                if pair is not None:  # LoRA: y += B A x on this module's outputs
                    y[..., offset : offset + n] += F.linear(F.linear(x, pair[0]), pair[1])
                offset += n
        return y
