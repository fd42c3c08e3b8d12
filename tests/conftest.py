"""Shared pytest setup. Keep it small: fixtures used by one file live in that file."""


# ---- rollout tests (test_rollout.py, test_rollout_cli.py) --------------------------------------
import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def load_standin_module():
    """``benchmarks/standin_server.py``: the instant stand-in policy server (one copy for tests and benchmark)."""
    name = "agentgym_bench_standin_server"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / "standin_server.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def standin_server():
    """A stand-in policy server in a background thread; set ``.policy`` and read ``.requests``."""
    server = load_standin_module().StandinServer()
    server.start()
    yield server
    server.stop()
