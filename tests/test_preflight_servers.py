"""``agentgym train`` with servers given by URL checks them before any stage runs: a dead URL, or a
server of another model, fails in seconds with the URL named, not after the warm start."""

from __future__ import annotations

import time

import pytest

from agentgym.cli import main
from agentgym.config import ConfigError
from agentgym.preflight import check_servers
from agentgym.stages import train_command as trainer_main
from agentgym.trainer.config import load_config


def test_a_dead_server_url_fails_train_before_any_stage(monkeypatch, capsys):
    def no_stage(cfg):
        raise AssertionError("a stage ran before the servers were checked")

    monkeypatch.setattr(trainer_main, "run_start_stages", no_stage)
    start = time.monotonic()
    code = main(["train", "--env", "sokoban", "actor_rollout_ref.rollout.server_urls=[http://127.0.0.1:9]"])
    assert code != 0 and time.monotonic() - start < 60
    assert "http://127.0.0.1:9" in capsys.readouterr().err


def test_a_live_server_must_serve_the_model_named(embedded_server):
    server = embedded_server
    cfg = load_config(env="sokoban", overrides=[f"actor_rollout_ref.rollout.server_urls=[{server.url}]"])
    check_servers(cfg)  # tiny serves tiny
    cfg.actor_rollout_ref.model.path = "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ConfigError, match=server.url):
        check_servers(cfg)
