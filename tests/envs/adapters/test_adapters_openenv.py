"""OpenEnv both ways: ``agentgym env-serve`` (any env behind OpenEnv's API) and the ``openenv``
client env (any OpenEnv server as a text env). The tests marked ``extras`` use openenv-core
itself: its ``GenericEnvClient`` against env-serve, and a server built with its ``create_fastapi_app``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

import agentgym
from agentgym.envs.adapters.openenv_server import create_app
from agentgym.server.handles import AppThread
from tests.support.adapter_checks import assert_token_exact, needs, train_two_steps


@pytest.fixture
def sokoban_server():
    server = AppThread(create_app("sokoban"))
    yield server.url
    server.stop()


def test_client_env_steps_a_served_env_like_the_env_itself(sokoban_server):
    remote = agentgym.make("openenv", base_url=sokoban_server)
    local = agentgym.make("sokoban")
    assert remote.agentgym_server and remote.action_field == "message"
    for seed in (0, 5):
        assert remote.reset(seed=seed) == local.reset(seed=seed)
        for move in ("<answer>Up</answer>", "<answer>Left || Down</answer>", "nonsense", "<answer>Right</answer>"):
            assert remote.step(move) == local.step(move)
    remote.close()


def test_http_routes_follow_openenv(sokoban_server):
    with httpx.Client(base_url=sokoban_server) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        schema = http.get("/schema").json()
        assert schema["action"]["required"] == ["message"] and "messages" in schema["observation"]["properties"]
        assert http.get("/metadata").json()["name"] == "sokoban"
        stateless = http.post("/reset", json={"seed": 2}).json()
        assert set(stateless) == {"observation", "reward", "done"} and stateless["done"] is False
        assert stateless["observation"]["messages"][0]["role"] == "system"
        first = http.post("/reset", json={"seed": 2, "episode_id": "ep-1"}).json()
        assert first["observation"]["messages"] == stateless["observation"]["messages"]
        step = http.post("/step", json={"action": {"message": "<answer>Up</answer>"}, "episode_id": "ep-1"}).json()
        assert isinstance(step["reward"], float) and "messages" in step["observation"]
        assert http.get("/state", params={"episode_id": "ep-1"}).json()["step_count"] == 1
        assert http.post("/step", json={"action": {"text": "x"}}).status_code == 422
        assert http.post("/step", json={"action": {"message": "x"}, "episode_id": "nope"}).status_code == 404


def test_env_serve_command_serves_a_registered_env(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = os.path.join(os.path.dirname(sys.executable), "agentgym")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "agentgym.cli"]
    proc = subprocess.Popen(
        [*command, "env-serve", "--env", "sokoban-6x6-2", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        env = agentgym.make("openenv", base_url=url)
        messages, _ = env.reset(seed=1)
        assert messages == agentgym.make("sokoban-6x6-2").reset(seed=1)[0]
        env.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run([*command, "env-serve", "--env", "sokobn"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Did you mean 'sokoban'" in bad.stderr


@pytest.mark.slow
def test_two_step_train_on_a_served_env_is_token_exact(monkeypatch, tmp_path, sokoban_server):
    trajs, calls = train_two_steps(
        monkeypatch,
        tmp_path,
        "openenv",
        f"+env.kwargs.base_url={sokoban_server}",
        "data.max_response_length=96",
        "actor_rollout_ref.rollout.max_tokens_per_turn=16",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
    )
    assert len(trajs) == 8 and all(t.env_id == "openenv" for t in trajs)
    assert_token_exact(trajs, calls)


# ---- with openenv-core itself ----------------------------------------------------------------
@pytest.mark.extras
@needs("openenv", "openenv")
def test_openenv_generic_client_steps_env_serve(sokoban_server):
    from openenv.core.generic_client import GenericEnvClient

    local = agentgym.make("sokoban")
    with GenericEnvClient(base_url=sokoban_server).sync() as client:
        result = client.reset(seed=4)
        assert result.observation["messages"] == local.reset(seed=4)[0] and not result.done
        result = client.step({"message": "<answer>Down</answer>"})
        messages, reward, terminated, truncated, _ = local.step("<answer>Down</answer>")
        assert result.observation["messages"] == messages and result.reward == reward
        assert result.done == (terminated or truncated)
        assert client.state()["step_count"] == 1


@pytest.fixture
def counter_server():
    """A server built with openenv-core: say a number; reward 1 when it is the target, done then or
    after 3 steps."""
    from openenv.core.env_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class GuessAction(Action):
        guess: str

    class GuessObservation(Observation):
        prompt: str = ""

    class GuessEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(episode_id="e", step_count=0)
            self.target = 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.target = (seed or 0) % 10
            self._state = State(episode_id=episode_id or "e", step_count=0)
            return GuessObservation(prompt="Guess a digit.", done=False, reward=None)

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            right = action.guess.strip() == str(self.target)
            done = right or self._state.step_count >= 3
            return GuessObservation(prompt="right" if right else "wrong", done=done, reward=1.0 if right else 0.0)

        @property
        def state(self):
            return self._state

    server = AppThread(create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=8))
    yield server.url
    server.stop()


@pytest.mark.extras
@needs("openenv", "openenv")
def test_client_env_steps_an_openenv_core_server(counter_server):
    env = agentgym.make("openenv", base_url=counter_server, system_prompt="Play.")
    assert not env.agentgym_server and env.action_field == "guess"
    messages, _ = env.reset(seed=13)
    assert messages == [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess a digit."}]
    assert env.step("5") == ([{"role": "user", "content": "wrong"}], 0.0, False, False, {})
    new, reward, terminated, truncated, info = env.step("3")
    assert new == [{"role": "user", "content": "right"}] and reward == 1.0 and terminated and not truncated
    assert info["outcome_reward"] == 1.0
    env.reset(seed=1)
    for guess in "789":
        _, _, terminated, _, info = env.step(guess)
    assert terminated and info["outcome_reward"] == 0.0
    env.close()
