"""Math answer extraction, numeric equivalence and compute_score, on real GSM8K answers."""

from __future__ import annotations

import json
import re

import pytest

from agentgym.envs.rewards import (
    answers_match,
    compute_score,
    extract_answer,
    extract_boxed,
    extract_flexible,
    extract_strict,
    ground_truth_from_gsm8k_answer,
    parse_number,
)
from tests.support.shared_data import GSM8K_TEST


@pytest.fixture(scope="module")
def gsm8k_rows() -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    return [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]


# ---- extraction ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is\n#### 72", "72"),
        ("#### 1,000", "1000"),
        ("#### $18", "18"),
        ("####18.", "18"),
        ("#### -3", "-3"),
        ("#### 3.50", "3.50"),
        ("#### 3/4", "3/4"),
        ("first #### 5 then #### 7", "7"),  # the last match wins
        ("the answer is 72", None),
        ("", None),
    ],
)
def test_extract_strict(text: str, expected: str | None) -> None:
    assert extract_strict(text) == expected


def test_strict_only_reads_the_last_300_characters() -> None:
    early = "#### 42\n" + "blah " * 100
    assert extract_strict(early) is None
    assert extract_strict(early + "#### 43") == "43"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She makes 9 * 2 = 18 dollars.", "18"),
        ("The total is 1,250.", "1250"),
        ("about -4.5 degrees", "-4.5"),
        ("no numbers here.", None),
        ("#### 72", "72"),
    ],
)
def test_extract_flexible(text: str, expected: str | None) -> None:
    assert extract_flexible(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{72}.", "72"),
        (r"\boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{1} then \boxed{ {2} }", "{2}"),
        (r"\fbox{5}", "5"),
        (r"\boxed 9", "9"),
        (r"\boxed{unclosed", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_answer_rejects_unknown_method() -> None:
    with pytest.raises(ValueError, match="strict, flexible, boxed"):
        extract_answer("#### 1", "fuzzy")


def test_ground_truth_from_gsm8k_answer() -> None:
    assert ground_truth_from_gsm8k_answer("a\nb\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="####"):
        ground_truth_from_gsm8k_answer("no marker")


# ---- equivalence ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("72", "72.0"),
        ("72", "72.00"),
        ("1,000", "1000"),
        ("-3", "-3.0"),
        ("3/4", "0.75"),
        (r"\frac{3}{4}", "0.75"),
        ("$18", "18"),
        ("18.", "18"),
        ("50%", "50"),
        (r"\text{yes}", "Yes"),
    ],
)
def test_answers_match(a: str, b: str) -> None:
    assert answers_match(a, b)
    assert answers_match(b, a)


@pytest.mark.parametrize(("a", "b"), [("72", "73"), ("-3", "3"), ("3/4", "0.7"), ("1/0", "1"), (None, "1"), ("x", "y")])
def test_answers_differ(a: str | None, b: str) -> None:
    assert not answers_match(a, b)


def test_parse_number() -> None:
    assert parse_number("1,000") == 1000
    assert parse_number("0.75") == parse_number("3/4")
    assert parse_number("seven") is None


# ---- compute_score -------------------------------------------------------------------------
def test_compute_score_follows_verl() -> None:
    assert compute_score("#### 72", "72") == 1.0
    assert compute_score("#### 71", "72", format_score=0.1) == 0.1  # an answer, but wrong
    assert compute_score("it is 72", "72", format_score=0.1) == 0.0  # no strict answer at all
    assert compute_score("it is 72", "72", method="flexible") == 1.0
    assert compute_score(r"\boxed{72.0}", "72", method="boxed", score=2.0) == 2.0


@pytest.mark.parametrize("method", ["strict", "flexible", "boxed"])
def test_reference_answers_score_one_and_shifted_answers_zero(gsm8k_rows: list[dict], method: str) -> None:
    truths = [ground_truth_from_gsm8k_answer(r["answer"]) for r in gsm8k_rows]

    def as_response(answer: str) -> str:
        return re.sub(r"####\s*(.+)$", r"The answer is \\boxed{\1}.", answer) if method == "boxed" else answer

    for row, truth in zip(gsm8k_rows, truths):
        assert compute_score(as_response(row["answer"]), truth, method=method) == 1.0, row["answer"][-60:]
    different = 0
    for i, truth in enumerate(truths):
        other = gsm8k_rows[(i + 1) % len(gsm8k_rows)]["answer"]
        if answers_match(truths[(i + 1) % len(truths)], truth):
            continue  # two neighbours with the same answer
        different += 1
        assert compute_score(as_response(other), truth, method=method) == 0.0
    assert different > 0.9 * len(truths)
