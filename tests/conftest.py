"""Shared pytest setup. Keep it small: fixtures used by one file live in that file."""


# ---- the stand-in policy server (rollout and gateway tests) --------------------------------------
import importlib  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def load_standin_module():
    """``benchmarks/standin_server.py``: the one stand-in policy server of tests and benchmarks, imported
    as ``standin_server`` (as ``benchmarks/gateway.py`` imports it: one module object)."""
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.append(benchmarks)
    return importlib.import_module("standin_server")


@pytest.fixture
def standin_server():
    """A stand-in policy server in a background thread; set ``.policy`` and read ``.requests``."""
    server = load_standin_module().StandinServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def oracle():
    """What the stand-in's ``echo`` mode samples for a prompt, recomputed here (``reply_ids``,
    ``logprobs``, ``tok``): tests/test_gateway.py, tests/test_gateway_reliability.py."""
    return load_standin_module().BuiltinPolicy("echo")
