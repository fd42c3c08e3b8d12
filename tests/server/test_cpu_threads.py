"""``agentgym serve --threads``: the torch threads of a server process of its own on a CPU."""

from __future__ import annotations

import argparse

import torch

from agentgym.server.launch import set_cpu_threads
from agentgym.stages.serve_command import add_arguments


def test_threads_flag_sets_torch_threads_on_a_cpu_only():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--threads", "1"]).threads == 1
    assert parser.parse_args([]).threads is None
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(None, "cpu") == before  # default: torch's own
        assert set_cpu_threads(1, "cuda") == before  # a GPU server's threads are left alone
        assert set_cpu_threads(1, "cpu") == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
