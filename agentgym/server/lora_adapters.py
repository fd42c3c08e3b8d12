"""Server side, applying: LoRA adapters in the embedded engine: ``<module>.lora_A.weight`` / ``<module>.lora_B.weight``
tensors pushed by a LoRA trainer (``agentgym.model.lora.push_state``: B already carries the
scale ``lora_alpha / lora_rank``) change what those modules compute to ``W x + B (A x)``.

The lean forward adds ``B (A x)`` to the module's output, so the base weights never change and
a new adapter replaces the old exactly. Through transformers' own forward the adapters are
merged into the weights instead, from a copy of the base weights kept at the first push (so
versions never accumulate rounding).
"""

from __future__ import annotations

from typing import Any

import torch

SUFFIX_A, SUFFIX_B = ".lora_A.weight", ".lora_B.weight"


def split(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """``(plain weights, {module name: (A, B)})``; raises ``ValueError`` if an A lacks its B."""
    plain = {k: v for k, v in state.items() if not k.endswith((SUFFIX_A, SUFFIX_B))}
    adapters = {}
    for key in state:
        if key.endswith(SUFFIX_A):
            name = key[: -len(SUFFIX_A)]
            if name + SUFFIX_B not in state:
                raise ValueError(f"{key} came without {name + SUFFIX_B}")
            adapters[name] = (state[key], state[name + SUFFIX_B])
    return plain, adapters


class EngineAdapters:
    """The adapters an engine applies, by module object (what the lean forward looks up)."""

    def __init__(self, model: Any, merge: bool) -> None:
        self.model = model
        self.merge = merge
        self.by_module: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
        self._base: dict[Any, torch.Tensor] = {}

    def load(self, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Replace the adapters; an empty dict removes them (the base model again)."""
        modules = dict(self.model.named_modules())
        unknown = [n for n in adapters if not isinstance(modules.get(n), torch.nn.Linear)]
        if unknown:
            raise ValueError(f"adapters for modules this model has no linear layer at: {unknown[:5]}")
        loaded = {}
        for name, (a, b) in adapters.items():
            weight = modules[name].weight
            if a.shape[1] != weight.shape[1] or b.shape[0] != weight.shape[0] or a.shape[0] != b.shape[1]:
                raise ValueError(
                    f"{name}: adapter shapes {tuple(a.shape)}, {tuple(b.shape)} do not fit a weight "
                    f"of shape {tuple(weight.shape)}"
                )
            loaded[modules[name]] = (a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype))
        if self.merge:
            self._merge(loaded)
        else:  # in place: the lean forward holds this dict
            self.by_module.clear()
            self.by_module.update(loaded)

    @torch.no_grad()
    def _merge(self, loaded: dict[Any, tuple[torch.Tensor, torch.Tensor]]) -> None:
        tied = {
            id(p)
            for name, p in self.model.named_parameters(remove_duplicate=False)
            if not name.startswith(("lm_head", "model.lm_head"))
        }
        for module in loaded:
            if module not in self._base and id(module.weight) in tied:  # lm_head tied to the embeddings:
                module.weight = torch.nn.Parameter(module.weight.detach().clone(), requires_grad=False)  # untie
        for module in set(self._base) | set(loaded):
            base = self._base.setdefault(module, module.weight.detach().clone())
            pair = loaded.get(module)
            if pair is None:
                module.weight.copy_(base)
            else:
                module.weight.copy_((base.float() + pair[1].float() @ pair[0].float()).to(base.dtype))
