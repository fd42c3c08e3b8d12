"""oneDNN-packed linear groups (``agentgym.server.packed_linears``): the same products as the plain
modules, and never stale after a weight changes in place, by rebinding, or gains a LoRA adapter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentgym.server.packed_linears import PackedGroup, available

pytestmark = pytest.mark.skipif(not available(torch.zeros(1)), reason="this torch has no oneDNN linear packing")


def plain(modules, x, adapters=None):
    outs = []
    for m in modules:
        y = F.linear(x, m.weight, m.bias)
        if adapters and m in adapters:
            a, b = adapters[m]
            y = y + F.linear(F.linear(x, a), b)
        outs.append(y)
    return torch.cat(outs, dim=-1)


def test_a_packed_group_computes_its_modules_and_follows_every_weight_change():
    torch.manual_seed(0)
    mods = [torch.nn.Linear(16, 8), torch.nn.Linear(16, 4, bias=False), torch.nn.Linear(16, 4)]
    group = PackedGroup(mods, batch_hint=4)
    x = torch.randn(3, 5, 16)
    with torch.inference_mode():
        assert torch.allclose(group(x), plain(mods, x), atol=1e-5)
        mods[1].weight.mul_(3.0)  # in place (a pushed state dict is copied like this)
        assert torch.allclose(group(x), plain(mods, x), atol=1e-5)
        mods[2].bias.add_(1.0)
        assert torch.allclose(group(x), plain(mods, x), atol=1e-5)
    mods[0].weight.data = torch.randn(8, 16)  # rebound (a trainer's tensors shared with the engine)
    with torch.inference_mode():
        assert torch.allclose(group(x), plain(mods, x), atol=1e-5)
        adapters = {mods[1]: (torch.randn(2, 16), torch.randn(4, 2))}  # LoRA on the middle module only
        assert torch.allclose(group(x, adapters), plain(mods, x, adapters), atol=1e-4)
