"""Tools: call parsing, the calculator, the Python sandbox's limits, the Toolbox, the GSM8K tool env."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

import agentgym
import agentgym.envs.tools.sandbox as sandbox_package
from agentgym.envs.gsm8k_tool import Gsm8kToolEnv
from agentgym.envs.tools import (
    Tool,
    Toolbox,
    make_tool,
    normalize_tool_calls,
    parse_tool_calls,
    split_reply,
)
from agentgym.envs.tools.calculator import CalculatorTool, calculate
from agentgym.envs.tools.python import PythonTool
from agentgym.envs.tools.sandbox import (
    MODE_ENV,
    SandboxUnavailable,
    bubblewrap,
    guardrail,
    process,
    resolve_mode,
    run_python,
    strong_problem,
)
from tests.support.shared_data import GSM8K_TEST

TIMEOUT_S = 2.0


def hermes(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_children_before: set[int] = set()


@pytest.fixture(autouse=True)
def _note_children_before():
    """Other tests in the session may leave long-lived children (multiprocessing's resource
    tracker, a server process); only processes started during this test count."""
    _children_before.clear()
    _children_before.update(p.pid for p in psutil.Process().children(recursive=True))


def _new_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in _children_before]


def no_children_left() -> bool:
    """No process started during this test is still around (zombies included)."""
    deadline = time.monotonic() + 1.0
    while _new_children() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _new_children()


# ---- parsing -------------------------------------------------------------------------------
def test_parse_hermes_calls() -> None:
    text = "Let me compute. " + hermes("calculator", expression="2+2") + "\n" + hermes("python", code="print(1)")
    content, calls, errors = parse_tool_calls(text, id_prefix="c")
    assert content == "Let me compute." and errors == []
    assert [c["id"] for c in calls] == ["c0", "c1"]
    assert calls[0] == {
        "id": "c0",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
    }


def test_calls_inside_think_are_ignored() -> None:
    text = "<think>maybe " + hermes("python", code="x") + "</think>Answer: " + hermes("calculator", expression="1")
    content, calls, errors = parse_tool_calls(text)
    assert [c["function"]["name"] for c in calls] == ["calculator"] and not errors
    assert content.startswith("<think>maybe <tool_call>")
    assert parse_tool_calls("<think>still thinking " + hermes("python", code="x"))[1] == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>{not json}</tool_call>", "invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ("<tool_call>[1, 2]</tool_call>", "expected a JSON object"),
        ('<tool_call>{"name": "calculator"', "never closed"),
    ],
)
def test_malformed_calls_become_errors(text: str, message: str) -> None:
    content, calls, errors = parse_tool_calls("before " + text)
    assert calls == [] and len(errors) == 1 and message in errors[0] and "<tool_call>" in errors[0]
    assert content == "before"


def test_parse_is_lenient_where_models_are_sloppy() -> None:
    fenced = '<tool_call>\n```json\n{"name": "python", "parameters": {"code": "print(1)\nprint(2)"}}\n```\n</tool_call>'
    _, calls, errors = parse_tool_calls(fenced)
    assert not errors and json.loads(calls[0]["function"]["arguments"]) == {"code": "print(1)\nprint(2)"}
    _, calls, _ = parse_tool_calls(
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>'
    )
    assert calls[0]["function"]["arguments"] == '{"expression": "1"}'
    assert parse_tool_calls("plain answer #### 3") == ("plain answer #### 3", [], [])


def test_native_tool_calls() -> None:
    raw = [
        {"id": "abc", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}},
        {"type": "function", "function": {"name": "python", "arguments": '{"code": "print(2)"}'}},
        {"function": {}},
    ]
    calls, errors = normalize_tool_calls(raw, id_prefix="n")
    assert [c["id"] for c in calls] == ["abc", "n1"] and len(errors) == 1
    assert calls[0]["function"]["arguments"] == '{"expression": "1+1"}'
    content, calls, _ = split_reply({"role": "assistant", "content": "hi", "tool_calls": raw[:1]})
    assert content == "hi" and calls[0]["id"] == "abc"


# ---- calculator ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("(16 - 3 - 4) * 2", "18"),
        ("6 / 3", "2"),
        ("1/3", "0.333333333333"),
        ("2^10", "1024"),
        ("1,000 * 3", "3000"),
        ("sqrt(16) + abs(-2)", "6"),
        ("-2 ** 2", "-4"),
        ("7 // 2 + 7 % 2", "4"),
    ],
)
def test_calculator(expression: str, result: str) -> None:
    assert calculate(expression) == result


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('true')", "9**9**9**9", "10**400", "1/0", "2 +", "x + 1", "[1, 2]"]
)
def test_calculator_refuses_quickly(expression: str) -> None:
    start = time.perf_counter()
    result = Toolbox([CalculatorTool()]).execute(
        {"id": "1", "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    )
    assert result.error == "tool_error" and result.text.startswith("Error:")
    assert time.perf_counter() - start < 0.5


# ---- toolbox -------------------------------------------------------------------------------
class CrashTool(Tool):
    name: ClassVar[str] = "crash"

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        raise RuntimeError("boom")


class HangTool(Tool):
    name: ClassVar[str] = "hang"

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        time.sleep(30)
        return "late", 0.0, {}


def call(name: str, arguments: Any, call_id: str = "x") -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


@pytest.mark.parametrize(
    ("the_call", "kind", "says"),
    [
        (call("nope", {}), "unknown_tool", "Available tools: calculator, crash, hang"),
        (call("calculator", "{bad json"), "bad_arguments", "not valid JSON"),
        (call("calculator", "[1]"), "bad_arguments", "must be a JSON object"),
        (call("calculator", {}), "tool_error", '{"expression"'),
        (call("crash", {}), "tool_error", "crash failed: RuntimeError: boom"),
        (call("hang", {}), "timeout", "did not finish within 0.3 s"),
    ],
)
def test_toolbox_turns_failures_into_messages(the_call: dict, kind: str, says: str) -> None:
    box = Toolbox([CalculatorTool(), CrashTool(), HangTool()], call_timeout_s=0.3)
    result = box.execute(the_call)
    assert result.error == kind and says in result.text
    assert result.message() == {
        "role": "tool",
        "tool_call_id": "x",
        "name": the_call["function"]["name"],
        "content": result.text,
    }


def test_toolbox_limits_and_truncation() -> None:
    box = Toolbox([CalculatorTool()], max_calls_per_turn=2, max_calls_per_episode=3, max_output_chars=5)
    calls = [call("calculator", {"expression": "10**20"}, f"c{i}") for i in range(3)]
    results = box.run_turn(calls, ["tool call 9: bad"], used=0)
    assert [r.error for r in results] == ["parse", None, None, "limit"]
    assert results[1].text.startswith("10000\n... [truncated")
    later = box.run_turn(calls[:2], [], used=2)
    assert [r.error for r in later] == [None, "limit"] and "budget" in later[1].text


def test_tools_are_registered() -> None:
    assert {"calculator", "python"} <= set(agentgym.registered("tool"))
    schema = make_tool("python").schema
    assert schema["type"] == "function" and schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]


# ---- python sandbox ------------------------------------------------------------------------
STRONG_PROBLEM = strong_problem()


@pytest.fixture(autouse=True)
def _weak_sandbox_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the strong sandbox cannot run, the tests of everything else opt into the weak one
    (what a user without bubblewrap must do too); strong-only tests skip."""
    if STRONG_PROBLEM is not None:
        monkeypatch.setenv(MODE_ENV, "weak")


def skip_without_strong() -> None:
    if STRONG_PROBLEM is not None:
        pytest.skip(f"the strong sandbox cannot run here: {STRONG_PROBLEM}")


@pytest.fixture(params=["strong", "weak"])
def python_tool(request: pytest.FixtureRequest) -> PythonTool:
    """The strong sandbox, and the weak one with its in-process audit hook alone."""
    if request.param == "weak":
        return PythonTool(timeout_s=TIMEOUT_S, memory_mb=512, isolate_network=False, use_cgroup=False, sandbox="weak")
    skip_without_strong()
    return PythonTool(timeout_s=TIMEOUT_S, memory_mb=512, sandbox="strong")


def run_tool(tool: Tool, code: str) -> tuple[Any, float]:
    start = time.perf_counter()
    result = Toolbox([tool]).execute(call(tool.name, {"code": code}))
    return result, time.perf_counter() - start


def test_python_runs_code(python_tool: PythonTool) -> None:
    result, _ = run_tool(python_tool, "import math\nprint(math.factorial(10))\nopen('notes.txt', 'w').write('ok')")
    assert result.ok and result.text == "3628800"
    assert run_tool(python_tool, "x = 1")[0].text.startswith("(no output")
    assert no_children_left()


# name, code, then (kind, what the message says) under the strong and the weak sandbox
HOSTILE = [
    (
        "infinite loop",
        "while True:\n    pass",
        ("timeout", "did not finish within"),
        ("timeout", "did not finish within"),
    ),
    (
        "fork bomb",
        "import os\nwhile True:\n    os.fork()",
        ("code_error", "Resource temporarily unavailable"),
        ("code_error", "starting processes is not allowed"),
    ),
    ("10 GB allocation", "x = bytearray(10 * 2**30)", ("code_error", "MemoryError"), ("code_error", "MemoryError")),
    (
        "network socket",
        "import socket\nsocket.socket().connect(('1.1.1.1', 80))",  # seccomp, else the netns
        ("code_error", "Operation not permitted" if platform.machine() == "x86_64" else "Network is unreachable"),
        ("code_error", "network access is not allowed"),
    ),
    (
        "subprocess",
        "import subprocess\nsubprocess.run(['sleep', '100'])",
        ("timeout", "did not finish within"),
        ("code_error", "starting processes is not allowed"),
    ),
]


@pytest.mark.parametrize(("name", "code", "strong", "weak"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_python_survives_hostile_code(
    python_tool: PythonTool, name: str, code: str, strong: tuple[str, str], weak: tuple[str, str]
) -> None:
    kind, says = strong if python_tool.mode == "strong" else weak
    result, seconds = run_tool(python_tool, code)
    assert result.error == kind and says in result.text, (name, result.text)
    assert seconds < TIMEOUT_S + 1.5, name
    assert no_children_left(), name


def test_weak_python_cannot_write_outside_its_scratch_directory(tmp_path: Path) -> None:
    python_tool = PythonTool(
        timeout_s=TIMEOUT_S, memory_mb=512, isolate_network=False, use_cgroup=False, sandbox="weak"
    )
    target = tmp_path / "escaped.txt"
    code = f"print(__import__('os').getcwd())\nopen({str(target)!r}, 'w').write('x')"
    result = python_tool.run(code)
    assert result.exit_code == 1 and "writing outside the scratch directory is not allowed" in result.stderr
    assert not target.exists()
    scratch = result.stdout.strip()
    assert scratch and not os.path.exists(scratch)  # the scratch directory is gone
    for code in (
        f"import os\nos.remove({str(tmp_path)!r})",
        f"import os\nos.symlink({str(target)!r}, 'l')\nopen('l', 'w')",
    ):
        assert "not allowed" in python_tool.run(code).stderr
    assert not target.exists() and no_children_left()


def test_strong_python_sees_a_private_fresh_tmp_and_a_read_only_system(tmp_path: Path) -> None:
    skip_without_strong()
    tool = PythonTool(timeout_s=TIMEOUT_S, sandbox="strong")
    first = tool.run(
        f"import os\nprint(os.getcwd(), os.getuid())\nopen('notes.txt', 'w').write('x')\n"
        f"print(os.path.exists({str(tmp_path)!r}))"
    )
    cwd, uid, sees_host_tmp = first.stdout.split()
    assert first.ok and cwd == "/tmp" and sees_host_tmp == "False"
    assert uid != "0" or os.geteuid() != 0  # root here: nobody there
    second = tool.run("import os\nprint(sorted(os.listdir('.')))\nopen('/usr/escaped', 'w')")
    from agentgym.envs.tools.sandbox.bubblewrap import _python_roots

    # empty, but for the way to an interpreter that lives under /tmp (a clone in /tmp: bound read-only)
    own = sorted({Path(r).parts[2] for r in _python_roots(None) if Path(r).parts[:2] == ("/", "tmp")})
    assert second.stdout.strip() == str(own) and "Read-only file system" in second.stderr
    assert not os.path.exists("/usr/escaped") and no_children_left()


def test_strong_sandbox_runs_an_interpreter_that_lives_under_tmp(tmp_path: Path) -> None:
    """A clone (and its venv) under /tmp: the private /tmp must not hide the interpreter, and shows
    nothing else of the host's /tmp."""
    skip_without_strong()
    import subprocess
    import venv

    from agentgym.envs.tools.sandbox import run_python

    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip("pytest's tmp_path is not under /tmp here")
    venv.create(tmp_path / "venv", with_pip=False)
    (tmp_path / "secret.txt").write_text("host")
    python = str(tmp_path / "venv" / "bin" / "python")
    assert subprocess.run([python, "-c", "pass"]).returncode == 0
    code = f"import os, sys\nprint(sys.executable, os.path.exists({str(tmp_path / 'secret.txt')!r}))"
    result = run_python(code, mode="strong", python=python)
    assert result.exit_code == 0 and result.stdout.split() == [python, "False"], result.stderr


def test_strong_python_keeps_threads_subprocesses_and_multiprocessing() -> None:
    skip_without_strong()
    code = """
import concurrent.futures, subprocess, threading
out = []
worker = threading.Thread(target=lambda: out.append("thread"))
worker.start()
worker.join()
print(out[0], subprocess.run(["echo", "subprocess"], capture_output=True, text=True).stdout.strip())
with concurrent.futures.ProcessPoolExecutor(2) as pool:  # semaphores in /dev/shm
    print(sum(pool.map(abs, [-1, -2, -3])))
"""
    result = PythonTool(timeout_s=10, sandbox="strong").run(code)
    assert result.ok and result.stdout.split() == ["thread", "subprocess", "6"], result.stderr
    assert no_children_left()


def test_strong_python_traceback_shows_the_code() -> None:
    skip_without_strong()
    result, _ = run_tool(PythonTool(timeout_s=TIMEOUT_S, sandbox="strong"), "def f():\n    return 1 / 0\nf()")
    assert result.error == "code_error" and "return 1 / 0" in result.text and "ZeroDivisionError" in result.text
    assert "<string>" not in result.text  # none of the sandbox's own frames


def test_python_output_is_truncated() -> None:
    tool = PythonTool(timeout_s=10, max_output_chars=100)  # (100,000 unbuffered writes: slow on a busy machine)
    result, _ = run_tool(tool, "for i in range(100000):\n    print('line', i)")
    assert result.ok and "truncated" in result.text and len(result.text) < 200


def test_python_runs_concurrently() -> None:
    outputs: list[str] = []

    def one(i: int) -> None:
        outputs.append(run_python(f"print({i} * 2)", timeout_s=TIMEOUT_S).stdout.strip())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outputs, key=int) == [str(i * 2) for i in range(6)] and no_children_left()


def test_cgroup_cleanup_kills_processes_that_left_the_session() -> None:
    """What the cgroup layer adds: a process that escaped the process group (here with setsid)
    is still found and killed."""
    if "cgroup" not in run_python("pass", timeout_s=TIMEOUT_S, mode="weak").layers or not shutil.which("setsid"):
        pytest.skip("no writable pids cgroup here")
    cgroups, _ = process.make_run_cgroups(16, None)
    (cgroup,) = cgroups
    proc = subprocess.Popen(
        ["sh", "-c", "setsid sleep 30 & exec sleep 30"],
        start_new_session=True,
        preexec_fn=process.make_preexec({}, [cgroup.join]),
    )
    try:

        def escaped() -> list[int]:
            out = []
            for pid in cgroup.pids():
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(pid) != proc.pid:
                        out.append(pid)
            return out

        deadline = time.monotonic() + 5
        while not escaped() and time.monotonic() < deadline:
            time.sleep(0.01)
        runaways = escaped()
        assert runaways, "the background sleep never left the process group"
        process.kill_session(proc)
        assert running(runaways[0])  # the process-group kill missed it
        cgroup.kill_all()
        assert not cgroup.pids() and not any(running(p) for p in runaways)  # dead (init reaps the zombie later)
    finally:
        process.kill_session(proc)
        cgroup.kill_all()
        cgroup.remove()
    assert not cgroup.path.exists()


@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_a_cgroup_the_child_cannot_join_is_given_up(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "strong":
        skip_without_strong()
    if "cgroup" not in run_python("pass", timeout_s=TIMEOUT_S, mode=mode).layers:
        pytest.skip("no writable pids cgroup here")
    monkeypatch.setattr(process, "_cgroup_parents", dict(process._cgroup_parents))  # restored afterwards
    made: list[process.RunCgroup] = []

    def unjoinable(*args: Any) -> tuple[list[process.RunCgroup], list[str]]:
        cgroups, layers = process.make_run_cgroups(*args)
        for cgroup in cgroups:
            cgroup.join = "/nonexistent/tasks"
        made.extend(cgroups)
        return cgroups, layers

    monkeypatch.setattr(bubblewrap if mode == "strong" else guardrail, "make_run_cgroups", unjoinable)
    result = run_python("print('ran')", timeout_s=TIMEOUT_S, mode=mode)
    assert result.ok and result.stdout == "ran\n" and "cgroup" not in result.layers
    assert made and not any(c.path.exists() for c in made)
    assert "cgroup" not in run_python("pass", timeout_s=TIMEOUT_S, mode=mode).layers  # not tried again


def test_sandbox_reports_its_layers() -> None:
    weak = run_python("pass", timeout_s=TIMEOUT_S, mode="weak")
    assert weak.mode == "weak" and {"scratch", "rlimits", "session", "audit"} <= set(weak.layers)
    skip_without_strong()
    strong = run_python("pass", timeout_s=TIMEOUT_S, mode="strong")
    assert strong.mode == "strong" and strong.ok
    assert {"namespaces", "read-only-root", "tmpfs-quota", "rlimits", "session"} <= set(strong.layers)
    assert "audit" not in strong.layers


def test_sandbox_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODE_ENV, "weak")
    assert resolve_mode() == "weak" and resolve_mode("strong") == "strong"
    assert PythonTool(sandbox="weak").schema["function"]["description"] == PythonTool.DESCRIPTIONS["weak"]
    monkeypatch.delenv(MODE_ENV)
    assert resolve_mode() == "strong"
    monkeypatch.setenv(MODE_ENV, "paranoid")
    with pytest.raises(ValueError, match="strong, weak"):
        resolve_mode()


def test_without_bubblewrap_the_tool_refuses_loudly_unless_weak_is_chosen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bubblewrap, "_problem", [])  # probe again, on a PATH without bwrap
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(MODE_ENV, raising=False)
    with caplog.at_level("ERROR"), pytest.raises(SandboxUnavailable, match="AGENTGYM_SANDBOX=weak") as refused:
        PythonTool(timeout_s=TIMEOUT_S)
    assert "bubblewrap (`bwrap`) is not installed" in str(refused.value)
    assert any("cannot run here" in r.getMessage() for r in caplog.records)  # said at start, in the log
    with pytest.raises(SandboxUnavailable):
        run_python("print(1)", timeout_s=TIMEOUT_S)
    monkeypatch.setattr(sandbox_package, "_warned_weak", False)
    with caplog.at_level("WARNING"):
        tool = PythonTool(timeout_s=TIMEOUT_S, sandbox="weak")
    assert any("WEAK sandbox" in r.getMessage() for r in caplog.records)
    assert tool.mode == "weak" and tool.run("print(6 * 7)").stdout.strip() == "42"


# ---- the GSM8K tool env --------------------------------------------------------------------
@pytest.fixture()
def tool_env() -> Gsm8kToolEnv:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    return agentgym.make(
        "gsm8k_tool",
        data_files=GSM8K_TEST,
        tool_kwargs={"python": {"timeout_s": TIMEOUT_S}},
        max_turns=4,
        tool_reward=0.1,
    )


def test_tool_env_calculator_then_answer(tool_env: Gsm8kToolEnv) -> None:
    messages, info = tool_env.reset(options={"index": 0})
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator", "python"]
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    new, reward, terminated, truncated, info = tool_env.step(
        "Eggs left: " + hermes("calculator", expression="(16-3-4)*2")
    )
    assert new == [{"role": "tool", "tool_call_id": "call_1_0", "name": "calculator", "content": "18"}]
    assert (reward, terminated, truncated) == (0.1, False, False)
    new, reward, terminated, truncated, info = tool_env.step("She makes 18 dollars.\n#### 18")
    assert (new, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["outcome_reward"] == 1.0 and info["success"]
    assert info["metrics"]["tool_calls/calculator"] == 1.0 and info["metrics"]["turns"] == 2.0


def test_tool_env_native_calls_and_errors(tool_env: Gsm8kToolEnv) -> None:
    tool_env.reset(options={"index": 0})
    native = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("python", {"code": "print((16 - 3 - 4) * 2)"}, "py1"), call("weather", {}, "w1")],
    }
    new, reward, *_ = tool_env.step(native)
    assert [(m["tool_call_id"], m["content"][:12]) for m in new] == [("py1", "18"), ("w1", "Error: unkno")]
    assert reward == pytest.approx(0.1)
    new, _, terminated, _, info = tool_env.step("<tool_call>{oops}</tool_call>")
    assert not terminated and new[0]["role"] == "tool" and "invalid JSON" in new[0]["content"]
    assert info["turn_metrics"]["tool_errors/parse"] == 1.0
    _, _, terminated, _, info = tool_env.step("#### 17")
    assert terminated and info["outcome_reward"] == 0.0
    assert info["metrics"]["tool_errors"] == 2.0


def test_tool_env_truncates_after_max_turns(tool_env: Gsm8kToolEnv) -> None:
    tool_env.reset(options={"index": 0})
    results = [tool_env.step(hermes("calculator", expression="1+1")) for _ in range(4)]
    assert [r[3] for r in results] == [False, False, False, True]
    assert results[-1][4]["outcome_reward"] == 0.0 and not results[-1][4]["success"]
    with pytest.raises(RuntimeError, match="reset"):
        tool_env.step("#### 18")


def test_tool_env_python_timeout_is_an_error_message(tool_env: Gsm8kToolEnv) -> None:
    tool_env.reset(options={"index": 0})
    start = time.perf_counter()
    new, *_, info = tool_env.step(hermes("python", code="while True: pass"))
    assert time.perf_counter() - start < TIMEOUT_S + 1.5
    assert "did not finish" in new[0]["content"] and info["turn_metrics"]["tool_errors/timeout"] == 1.0
    assert no_children_left()
