#!/usr/bin/env bash
# Set up .venv (if needed), lint, and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests also cover the env ecosystems' adapters (reasoning-gym, TextArena, verifiers, OpenEnv) and LoRA (peft)
AGENTGYM_EXTRAS="${AGENTGYM_EXTRAS:-dev,envs,lora}" bash scripts/setup.sh
export RAY_AUTH_MODE=disabled
echo "==> ruff check"
.venv/bin/ruff check .
echo "==> pytest"
.venv/bin/pytest -q -ra "$@"
