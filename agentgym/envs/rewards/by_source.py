"""Rewards chosen by a row's ``data_source``, and user reward functions, with veRL's signature.

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None)`` plays the part
of veRL's ``verl.utils.reward_score.default_compute_score`` for the sources agentgym has a rule for:

* ``openai/gsm8k``: GSM8K's rule (the answer after ``####``; ``agentgym.envs.rewards.compute_score``);
* ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``, ``math``,
  ``math_dapo``, ``aime*``: the last ``\\boxed{}`` answer against the ground truth (numbers compared
  as numbers, text after LaTeX normalisation; veRL's ``math_reward`` compares normalised strings).

Any other source raises ``UnknownDataSource``, whose message says to pass a reward function.
``load_compute_score(path, name)`` loads such a function from a Python file, as veRL's
``custom_reward_function.path`` / ``.name`` do. A function may return a number or a dict with a
``"score"`` entry (its other numeric entries are reported as metrics).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym.envs.rewards.equivalence import answers_match
from agentgym.envs.rewards.extraction import extract_boxed
from agentgym.envs.rewards.gsm8k import compute_score as gsm8k_score

ComputeScore = Callable[..., Any]

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math",
    "math_dapo",
    "math_dapo_reasoning",
)


class UnknownDataSource(ValueError):
    """No built-in rule scores this data source."""


def has_rule(data_source: str) -> bool:
    """Whether ``default_compute_score`` can score rows of ``data_source``."""
    return data_source in GSM8K_SOURCES or data_source in MATH_SOURCES or data_source.startswith("aime")


def math_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last ``\\boxed{}`` answer matches ``ground_truth``, else 0.0."""
    answer = extract_boxed(solution_str)
    return 1.0 if answer is not None and answers_match(answer, str(ground_truth)) else 0.0


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **_: Any
) -> float:
    """The built-in rule for ``data_source`` (see the module docstring)."""
    if data_source in GSM8K_SOURCES:
        return gsm8k_score(solution_str, str(ground_truth))
    if data_source in MATH_SOURCES or data_source.startswith("aime"):
        return math_score(solution_str, str(ground_truth))
    raise UnknownDataSource(
        f"no built-in reward for data_source={data_source!r} (built in: {', '.join(GSM8K_SOURCES + MATH_SOURCES)}, "
        f"aime*). Pass a reward function: custom_reward_function.path=FILE.py custom_reward_function.name="
        f"compute_score, with compute_score(data_source, solution_str, ground_truth, extra_info)"
    )


def load_compute_score(path: str | os.PathLike[str], name: str = "compute_score") -> ComputeScore:
    """``name`` from the Python file at ``path`` (veRL's ``custom_reward_function``); a clear
    ``ValueError`` when the file, the function or its signature is wrong."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(
            f"custom_reward_function.path={path} is not a file; give the path of a .py file that "
            f"defines {name}(data_source, solution_str, ground_truth, extra_info)"
        )
    module_name = f"agentgym_custom_reward_{abs(hash(str(file.resolve())))}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ValueError(f"custom_reward_function.path={path}: not an importable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ValueError(
                f"custom_reward_function.path={path} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise ValueError(
            f"{path} has no function {name!r} (custom_reward_function.name); it defines: "
            f"{', '.join(found) or 'no functions'}"
        )
    return fn


class RewardFunction:
    """A picklable reward: ``custom_reward_function`` ``(path, name)`` when given, else the
    built-in rule by data source. Calling it returns ``(score, extra)``: the float reward and the
    numeric entries of a dict result."""

    def __init__(self, path: str | None = None, name: str = "compute_score") -> None:
        self.path = path
        self.name = name or "compute_score"
        self._fn: ComputeScore | None = None

    def function(self) -> ComputeScore:
        if self._fn is None:
            self._fn = load_compute_score(self.path, self.name) if self.path else default_compute_score
        return self._fn

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "_fn": None}

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
    ) -> tuple[float, dict[str, float]]:
        result = self.function()(
            data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info or {}
        )
        if isinstance(result, dict):
            if "score" not in result:
                raise ValueError(f"reward function {self.name!r} returned a dict without 'score': {result!r}")
            extra = {k: float(v) for k, v in result.items() if k != "score" and isinstance(v, (int, float))}
            return float(result["score"]), extra
        return float(result), {}
