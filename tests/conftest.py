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
