"""Model output can never hang, crash or escape (issue 24): every door a policy's reply goes through
returns within the per-call budget, run in a worker process that is killed on a hang.

First the findings of issue 24, one test each (the sandbox's are in ``tools/sandbox_abuse/test_probes.py``);
then the bounded fuzz lane: every door on the adversarial corpus and on inputs hypothesis generates.
The long lane is ``benchmarks/fuzz_doors.py``, which prints the worst time per door.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.bench_modules import fuzz_doors

fuzz = fuzz_doors()
EXAMPLES = 50  # generated inputs per door here: the CI lane (the benchmark runs hundreds)


@pytest.fixture(scope="module")
def worker() -> Any:
    worker = fuzz.Worker()
    yield worker
    worker.close()


def returned(worker: Any, target: Any, *args: Any) -> Any:
    """What ``target(*args)`` (a function, or a door's name and its input) returned in the worker,
    having checked it returned within the budget."""
    outcome = worker.call(target, args if callable(target) else args[0], want_value=True)
    assert outcome.kind == "returned", outcome.detail
    assert outcome.cpu_s <= fuzz.BUDGET_S, f"took {outcome.cpu_s * 1e3:.0f} ms of CPU"
    return outcome.detail


# ---- the findings -----------------------------------------------------------------------------------
def test_calculator_bounds_round_digits_before_building_the_number(worker: Any) -> None:
    """``round(1, -10**300)`` computed 10**(10**300) holding the interpreter lock: the Toolbox's
    timeout thread never fired and memory grew until the OOM killer."""
    from agentgym.envs.tools.calculator import calculate

    assert returned(worker, calculate, "round(1, -10**300)") == "0"
    assert returned(worker, calculate, "round(123456, -10**7)") == "0"
    assert returned(worker, calculate, "round(2.567, 10**300)") == "2.567"
    result = returned(worker, "Toolbox.execute[expression]", "round(10**300, -10**300)")
    assert result.ok and result.text == "0"


def test_a_fence_with_a_long_whitespace_run_parses_in_linear_time(worker: Any) -> None:
    """The fence regex backtracked cubically: 3000 spaces took 17.5 s, 4000 took 46 s."""
    from agentgym.envs.tools import parse_tool_calls

    content, calls, errors = returned(worker, parse_tool_calls, "<tool_call>```" + " " * 3000 + "x</tool_call>")
    assert calls == [] and len(errors) == 1 and "invalid JSON" in errors[0]
    fenced = (
        "<tool_call>```json"
        + " " * 60_000
        + '{"name": "calculator", "arguments": {}}'
        + "\n" * 4000
        + "```</tool_call>"
    )
    _, calls, errors = returned(worker, parse_tool_calls, fenced)
    assert [c["function"]["name"] for c in calls] == ["calculator"] and errors == []


def test_deep_json_is_a_bad_call_not_a_recursion_error(worker: Any) -> None:
    """``"[" * 5000`` as a call's body or arguments raised RecursionError out of ``env.step`` and
    ``Toolbox.execute``, whose contracts say they never raise."""
    messages, _, terminated, _, _ = returned(worker, "gsm8k_tool.step", "<tool_call>" + "[" * 5000 + "</tool_call>")
    assert not terminated and "invalid JSON (nested too deeply)" in messages[0]["content"]
    result = returned(worker, "Toolbox.execute", "[" * 5000)
    assert result.error == "bad_arguments" and "nested too deeply" in result.text
    messages, *_ = returned(worker, "gsm8k_tool.step(calculator)", "[" * 5000)
    assert "not valid JSON (nested too deeply)" in messages[0]["content"]
    messages, *_ = returned(worker, "sokoban.step(move)", "[" * 5000)
    assert "arguments are not valid JSON" in messages[0]["content"]


def test_math_score_never_builds_a_huge_exponent(worker: Any) -> None:
    """``Fraction("1e9999999")`` built a ten-million-digit integer (17.6 s; one more digit: never)."""
    from agentgym.envs.rewards.by_source import math_score
    from agentgym.envs.rewards.equivalence import answers_match

    assert returned(worker, math_score, "so the answer is \\boxed{1e9999999}", "5") == 0.0
    assert returned(worker, math_score, "\\boxed{1e-99999999}", "0") == 0.0
    assert returned(worker, answers_match, "1e9999999", "1e9999999") is True  # compared as text
    assert returned(worker, answers_match, "2.5e3", "2500") is True  # ordinary exponents still as numbers
    assert returned(worker, answers_match, "\\frac{1}{3}", "2/6") is True


# ---- the fuzz lane ----------------------------------------------------------------------------------
def test_every_builtin_env_is_a_door() -> None:
    """A new env in pyproject's ``agentgym.envs`` entry points must join ``fuzz_doors.ENV_DOORS``."""
    from agentgym.registry import ENVS, env_spec

    builtin = [n for n in ENVS.names() if ENVS.package(n) == "agentgym" and not n.endswith("/*")]
    covered = {env_spec(name).load() for name in fuzz.ENV_DOORS}
    assert {n for n in builtin if env_spec(n).load() not in covered} == set()
    assert set(fuzz.ENV_DOORS.values()) <= set(fuzz.TEXT_DOORS)


@pytest.mark.parametrize("door", fuzz.TEXT_DOORS + fuzz.MESSAGE_DOORS)
def test_door_survives_the_adversarial_corpus(worker: Any, door: str) -> None:
    corpus = fuzz.adversarial_texts() if door in fuzz.TEXT_DOORS else fuzz.adversarial_messages()
    problems = [p for value in corpus if (p := fuzz.failure(door, value, fuzz.measure(worker, door, value)))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("door", fuzz.TEXT_DOORS + fuzz.MESSAGE_DOORS)
def test_door_survives_generated_inputs(worker: Any, door: str) -> None:
    from hypothesis import HealthCheck, Phase, given, settings

    # derandomized: CI sees the same inputs every run; no shrinking: a hang would be rerun many times
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz.texts() if door in fuzz.TEXT_DOORS else fuzz.messages())
    def check(value: Any) -> None:
        problem = fuzz.failure(door, value, fuzz.measure(worker, door, value))
        assert problem is None, problem

    check()


def test_a_hang_fails_the_call_and_the_next_call_gets_a_new_worker() -> None:
    """The lane's own promise: a call that never returns is killed, not waited for."""
    import time

    hanging = fuzz.Worker(hang_s=0.5)
    try:
        outcome = hanging.call(time.sleep, (60,))
        assert outcome.kind == "hung" and "killed" in outcome.detail
        assert hanging.call(json.loads, ("[1]",), want_value=True).detail == [1]
    finally:
        hanging.close()
