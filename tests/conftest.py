"""Shared pytest setup. Keep it small: fixtures used by one file live in that file."""

# ---- the stand-in policy server (rollout and gateway tests) --------------------------------------
import pytest

from tests.support import standin_server as standin_module


@pytest.fixture
def standin_server():
    """A stand-in policy server in a background thread; set ``.policy`` and read ``.requests``."""
    server = standin_module.StandinServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def oracle():
    """What the stand-in's ``echo`` mode samples for a prompt, recomputed here (``reply_ids``,
    ``logprobs``, ``tok``): tests/gateway/test_gateway.py, tests/gateway/test_gateway_reliability.py."""
    return standin_module.BuiltinPolicy("echo")


# ---- the tiny model's embedded server, one for the whole session ----------------------------------
_FOUND: dict[str, tuple[int, bool, float]] = {}  # the shared server's fingerprint at start, by URL


def _fingerprint(server) -> tuple[int, bool, float]:
    """Weight version, pause state and the weights' sum: what a test must leave as it found it."""
    import torch

    with torch.no_grad():
        total = sum(p.double().sum().item() for p in server.engine.model.parameters())
    return server.engine.weight_version, server.engine.paused, total


@pytest.fixture(scope="session")
def embedded_server():
    """The embedded server on the tiny model (a thread of this process, a free loopback port), shared
    by every test that only reads from it. A test that pushes weights, pauses the server without
    resuming it or stops it starts its own (``start_embedded_server``): one that leaves this one
    changed fails (``_embedded_server_left_as_found``)."""
    from agentgym.server.launch import start_embedded_server

    handle = start_embedded_server("tiny", port=0)
    _FOUND[handle.url] = _fingerprint(handle)
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def _embedded_server_left_as_found(request):
    yield
    if "embedded_server" in request.fixturenames:
        server = request.getfixturevalue("embedded_server")
        found, left = _FOUND[server.url], _fingerprint(server)
        assert left == found, (
            f"{request.node.nodeid} left the shared embedded server changed (weight version, paused, weight sum: "
            f"{found} -> {left}); a test that changes the server starts its own with start_embedded_server"
        )


# ---- built-in envs the checkout declares but a stale install's metadata lacks --------------------
def _register_declared_envs() -> None:
    """Register the ``agentgym.envs`` entry points of this checkout's pyproject.toml that the installed
    metadata does not list yet (an editable install made before an env was added: ``pip install -e .``
    refreshes it), so the tests see the checkout's envs."""
    from pathlib import Path

    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed metadata is all there is
        return

    from agentgym.registry import ENVS, import_object, registered

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["agentgym.envs"]
    known = set(registered("env"))
    for name, target in declared.items():
        if name not in known and not name.endswith("/*"):
            ENVS.register(name, import_object(target), package="agentgym")


_register_declared_envs()
