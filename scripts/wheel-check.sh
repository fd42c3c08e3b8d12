#!/usr/bin/env bash
# CI: what a user gets from `pip install agentgym` works away from the checkout.
# Builds the wheel, installs it (not editable) into a fresh venv, and runs a one-step
# `agentgym train --env sokoban` from an empty temporary directory. torch is pinned as in
# scripts/setup.sh and pip's cache is reused, so the step takes a minute or two.
#
#   bash scripts/wheel-check.sh          # KEEP=1 keeps the temporary directory
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${AGENTGYM_TORCH:-2.13.0}"
WORK="$(mktemp -d -t agentgym-wheel-XXXXXX)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
started=$SECONDS
phase=$SECONDS
lap() { echo "    ($1: $((SECONDS - phase)) s)"; phase=$SECONDS; }

echo "==> building the wheel"
"$PYTHON" -m venv "$WORK/venv"
pip=("$WORK/venv/bin/pip" -q --disable-pip-version-check)
"${pip[@]}" wheel --no-deps -w "$WORK/dist" "$REPO" 2> >(grep -v '^WARNING: Location' >&2)
wheel=$(ls "$WORK"/dist/agentgym-*.whl)
if ! "$WORK/venv/bin/python" -m zipfile -l "$wheel" | grep -q "agentgym/configs/train.yaml"; then
    echo "error: $wheel does not hold agentgym/configs/train.yaml (see setup.py)" >&2
    exit 1
fi
lap build

echo "==> installing $(basename "$wheel") into a fresh venv (torch==$TORCH_VERSION pinned)"
"${pip[@]}" install "torch==$TORCH_VERSION" 2> >(grep -v '^WARNING: Location' >&2)
installed=$("$WORK/venv/bin/python" -W ignore -c "import torch; print(torch.__version__)")
echo "torch==$installed" > "$WORK/constraints.txt"
"${pip[@]}" install -c "$WORK/constraints.txt" "$wheel" 2> >(grep -v '^WARNING: Location' >&2)
"$WORK/venv/bin/pip" check >/dev/null || { "$WORK/venv/bin/pip" check; exit 1; }
lap install

echo "==> agentgym train --env sokoban, one step, from $WORK/run"
mkdir -p "$WORK/run"
cd "$WORK/run"
env -u PYTHONPATH -u AGENTGYM_CONFIG_DIR RAY_AUTH_MODE=disabled "$WORK/venv/bin/agentgym" train --env sokoban \
    trainer.total_training_steps=1 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=1 \
    "trainer.default_local_dir=$WORK/run/out" "trainer.logger=[jsonl]"
for f in out/metrics.jsonl out/global_step_1/trainer_state.pt out/huggingface/config.json; do
    [ -f "$f" ] || { echo "error: the run left no $f" >&2; exit 1; }
done
lap train
echo "==> wheel check passed in $((SECONDS - started)) s"
