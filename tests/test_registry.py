"""The registry: entry-point plugins, ``agentgym envs``, and errors that suggest the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import agentgym
from agentgym import cli
from agentgym.registry import ENVS, UnknownNameError, env_spec, gym_name

PLUGIN_ENV = "plugin-echo"
PLUGIN_DIST = "agentgym-echo-plugin"

PLUGIN_MODULE = '''
"""A third-party env shipped by a separate distribution."""

from agentgym.envs.base import TextEnv


class EchoEnv(TextEnv):
    """Echo: repeats your reply back once."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "say something"}], {}

    def step(self, action):
        text = action if isinstance(action, str) else str(action.get("content"))
        return [{"role": "user", "content": text}], 1.0, True, False, {"outcome_reward": 1.0}
'''


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A throwaway distribution on ``sys.path``: a module plus its ``.dist-info`` metadata."""
    (tmp_path / "echo_plugin.py").write_text(PLUGIN_MODULE)
    info = tmp_path / "agentgym_echo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(f"""
        [agentgym.envs]
        {PLUGIN_ENV} = echo_plugin:EchoEnv
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ENVS.discover(force=True)
    yield tmp_path
    # The registry outlives the test; forget the plugin so later tests see a clean list.
    ENVS._entries.pop(PLUGIN_ENV, None)
    gymnasium.registry.pop(env_spec_id(PLUGIN_ENV), None)
    sys.modules.pop("echo_plugin", None)


def env_spec_id(name: str) -> str:
    return f"agentgym/{gym_name(name)}-v0"


def test_plugin_env_is_found_by_make_and_gymnasium(plugin_dir):
    assert PLUGIN_ENV in agentgym.registered()
    env = agentgym.make(PLUGIN_ENV)
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"] == "say something"
    assert env.step("hi")[0][0]["content"] == "hi"
    spec = env_spec(PLUGIN_ENV)
    assert spec.package == PLUGIN_DIST and spec.description == "Echo: repeats your reply back once."
    assert gymnasium.make(spec.gym_id).reset(seed=0)[0][0]["content"] == "say something"


def test_envs_command_lists_the_plugin_with_its_package(plugin_dir, capsys):
    assert cli.main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith(PLUGIN_ENV + " "))
    assert PLUGIN_DIST in row and "Echo: repeats your reply back once." in row
    sokoban = next(line for line in lines if line.startswith("sokoban "))
    assert "agentgym" in sokoban and "6x6" in sokoban


def test_envs_console_script_lists_the_plugin(plugin_dir):
    script = Path(sys.executable).with_name("agentgym")
    command = [str(script)] if script.exists() else [shutil.which("agentgym") or "agentgym"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([*command, "envs"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith(PLUGIN_ENV + " "))
    assert PLUGIN_DIST in row
    assert any(line.startswith("sokoban-10x10-3 ") for line in out.stdout.splitlines())


def test_unknown_name_suggests_the_closest_and_lists_the_known():
    with pytest.raises(UnknownNameError) as caught:
        agentgym.make("sokobn")
    message = str(caught.value)
    assert "Did you mean 'sokoban'?" in message
    for name in ("sokoban", "sokoban-6x6-2", "sokoban-10x10-3"):
        assert name in message
    assert isinstance(caught.value, KeyError)


def test_builtin_envs_are_registered_as_specs_and_with_gymnasium():
    names = agentgym.registered()
    for name in ("sokoban", "sokoban-6x6-1", "sokoban-6x6-2", "sokoban-8x8-2", "sokoban-10x10-3"):
        assert name in names
        assert env_spec(name).gym_id in gymnasium.registry
    assert env_spec("sokoban-10x10-3").kwargs == {"dim_room": (10, 10), "num_boxes": 3}
    assert env_spec("sokoban").package == "agentgym"


def test_registering_in_code_wins_over_rediscovery():
    from agentgym.envs.sokoban import SokobanEnv

    agentgym.register("sokoban-test-tiny", SokobanEnv, kwargs={"max_steps": 3}, description="tiny budget")
    try:
        ENVS.discover(force=True)
        env = agentgym.make("sokoban-test-tiny")
        assert env.max_steps == 3 and env_spec("sokoban-test-tiny").description == "tiny budget"
    finally:
        ENVS._entries.pop("sokoban-test-tiny", None)
        gymnasium.registry.pop(env_spec_id("sokoban-test-tiny"), None)
