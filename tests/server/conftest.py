"""The built-in tiny model and its tokenizer, loaded once per test module that asks for them."""

from __future__ import annotations

import pytest

from agentgym.model import load_causal_lm, load_tokenizer


@pytest.fixture(scope="module")
def model():
    return load_causal_lm("tiny")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")
