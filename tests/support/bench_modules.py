"""The benchmark scripts that tests drive (``benchmarks/`` is not a package), one module object each:
``benchmarks/gateway.py`` (as ``gateway_bench``, so it cannot shadow anything named ``gateway``) and
``fuzz_server``, ``fuzz_doors`` (imported by those names: the fuzz worker process imports ``fuzz_doors`` again) and
``benchmarks/train_step.py`` (as ``train_step_bench``: the Qwen2.5-0.5B-shape model it builds)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def fuzz_server() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    return importlib.import_module("fuzz_server")


def fuzz_doors() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    return importlib.import_module("fuzz_doors")


def gateway_bench() -> ModuleType:
    module = sys.modules.get("gateway_bench")
    if module is None:
        spec = importlib.util.spec_from_file_location("gateway_bench", BENCHMARKS / "gateway.py")
        module = sys.modules["gateway_bench"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def train_step_bench() -> ModuleType:
    module = sys.modules.get("train_step_bench")
    if module is None:
        spec = importlib.util.spec_from_file_location("train_step_bench", BENCHMARKS / "train_step.py")
        module = sys.modules["train_step_bench"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module
