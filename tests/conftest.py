"""Shared pytest setup. Keep it small: fixtures used by one file live in that file."""


# ---- the stand-in policy server (rollout and gateway tests) --------------------------------------
import pytest
from bench_modules import standin_server as load_standin_module


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
