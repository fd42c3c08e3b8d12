"""Starting and stopping vLLM as a child process, against a fake vLLM (tests/support/fake_engines) that
behaves as the real one does here: it hands its port to a child process that outlives a parent
killed alone. Nothing may be left running: not after SIGTERM to ``agentgym serve``, not when
the launching program ends or fails, not when the engine's first process is already gone; a
busy port is refused before anything starts; the engine gets the model's dtype unless told."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.server.handles import free_port
from agentgym.server.launchers import start_engine_server

ROOT = Path(__file__).resolve().parents[2]
FAKE_ENGINES = ROOT / "tests" / "support" / "fake_engines"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A model directory, an interpreter path that finds the fake vllm, and where it records itself."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(FAKE_ENGINES)]))
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "float32"}))
    return type("Fake", (), {"python": str(python), "record": record, "model": str(model)})


def recorded(path: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError(f"the fake vLLM did not record itself in {path}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent to reap it counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def gone(pids: list[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def port_free(port: int, timeout: float = 10.0) -> bool:
    """Whether the port can be listened on again (its closed connections may need a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
        time.sleep(0.1)


def test_engine_runs_in_the_models_dtype_unless_told(fake_vllm):
    for dtype, expected in ((None, "float32"), ("bfloat16", "bfloat16")):
        handle = start_engine_server("vllm", fake_vllm.model, python=fake_vllm.python, dtype=dtype, timeout=60)
        try:
            argv = recorded(fake_vllm.record)["argv"]
            assert argv[argv.index("--dtype") + 1] == expected
        finally:
            handle.stop()
            fake_vllm.record.unlink()


def test_stop_ends_the_whole_group_even_when_its_first_process_is_gone(fake_vllm):
    handle = start_engine_server("vllm", fake_vllm.model, python=fake_vllm.python, timeout=60)
    leader, engine = recorded(fake_vllm.record)["pids"]
    os.kill(leader, signal.SIGKILL)  # the API server dies alone; its engine process keeps the port
    handle.process.wait(10)
    assert alive(engine)
    handle.stop()
    assert gone([engine])


@pytest.mark.parametrize("ending", ["exception", "sigterm"])
def test_a_program_that_ends_takes_its_engines_with_it(fake_vllm, ending):
    """A program holding a started engine (the trainer, a script) fails, or is sent SIGTERM."""
    program = (
        f"from agentgym.server.launchers import start_engine_server\n"
        f"handle = start_engine_server('vllm', {fake_vllm.model!r}, python={fake_vllm.python!r}, timeout=60)\n"
        "print('up', flush=True)\n"
        + ("raise RuntimeError('the run failed')\n" if ending == "exception" else "import time; time.sleep(120)\n")
    )
    run = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline().strip() == "up", run.stderr.read()
        pids = recorded(fake_vllm.record)["pids"]
        if ending == "sigterm":
            run.send_signal(signal.SIGTERM)
        run.wait(30)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0
    assert gone(pids), "the engine outlived the program that started it"


def test_serve_goes_down_with_its_engine_and_refuses_a_busy_port(fake_vllm):
    port = free_port()
    serve = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "serve",
        "--engine",
        "vllm",
        "--model",
        fake_vllm.model,
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
    ]
    env = {**os.environ, "AGENTGYM_VLLM_PYTHON": fake_vllm.python}
    first = subprocess.Popen(serve, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stdout:
            if "ready" in line:
                break
        else:
            raise AssertionError(first.stderr.read())
        record = recorded(fake_vllm.record)
        assert record["argv"][record["argv"].index("--dtype") + 1] == "bfloat16"
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    assert gone(record["pids"]), "SIGTERM to agentgym serve left the vLLM processes running"
    assert port_free(port)
    # a port someone holds is refused with a clear error, and no engine is started
    fake_vllm.record.unlink()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        second = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and f"port {port} on 127.0.0.1 is already in use" in second.stderr
    assert not fake_vllm.record.exists()


@pytest.mark.parametrize(
    ("device", "extra", "chunked_flags"),
    [
        ("cpu", [], ["--no-enable-chunked-prefill"]),
        ("cpu", ["--enable-chunked-prefill"], ["--enable-chunked-prefill"]),  # the user's choice stands
        ("cuda", [], []),
    ],
)
def test_vllm_on_a_cpu_starts_without_chunked_prefill(fake_vllm, monkeypatch, device, extra, chunked_flags):
    """vLLM-CPU's engine dies on a seeded request prefilled in more than one step (agentgym/client/vllm_cpu.py)."""
    monkeypatch.setenv("FAKE_VLLM_DEVICE", device)
    handle = start_engine_server("vllm", fake_vllm.model, python=fake_vllm.python, extra_args=extra, timeout=60)
    try:
        argv = recorded(fake_vllm.record)["argv"]
        assert [a for a in argv if "chunked-prefill" in a] == chunked_flags
    finally:
        handle.stop()
