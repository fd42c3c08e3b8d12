"""The gateway most tests here drive: one over the stand-in policy server in echo mode (a child process,
``tests/support/standin_server.py``), per module. A module that needs another upstream defines its own
``standin`` or ``gw``."""

import pytest

from agentgym.gateway.serve import start_gateway
from tests.support.bench_modules import gateway_bench


@pytest.fixture(scope="module")
def standin():
    bench = gateway_bench()
    port = bench.free_port()
    proc = bench.start_standin(port, version=3)
    yield f"http://127.0.0.1:{port}"
    bench.stop(proc)


@pytest.fixture(scope="module")
def gw(standin):
    handle = start_gateway([standin], model="tiny", max_model_len=2048)
    yield handle
    handle.stop()
