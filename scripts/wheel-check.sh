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
# from a copy of the tracked and new files: setuptools' build/ directory in the checkout would
# carry files that no longer exist into the wheel
mkdir -p "$WORK/src"
if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$REPO" ls-files -z --cached --others --exclude-standard | (cd "$REPO" && tar --null -T - -cf -) \
        | tar -xf - -C "$WORK/src"
else
    tar -C "$REPO" --exclude=.venv --exclude=build --exclude=dist -cf - . | tar -xf - -C "$WORK/src"
fi
"$PYTHON" -m venv "$WORK/venv"
pip=("$WORK/venv/bin/pip" -q --disable-pip-version-check)
fast=(--no-compile)  # no .pyc for all of torch and ray: Python writes those it imports
"${pip[@]}" wheel --no-deps -w "$WORK/dist" "$WORK/src" 2> >(grep -v '^WARNING: Location' >&2)
wheel=$(ls "$WORK"/dist/agentgym-*.whl)
listing=$("$WORK/venv/bin/python" -m zipfile -l "$wheel")
for member in agentgym/configs/train.yaml agentgym/server/vllm_extension/agentgym_vllm_extension.py; do
    if ! grep -qF "$member" <<< "$listing"; then
        echo "error: $wheel does not hold $member (see setup.py and pyproject.toml)" >&2
        exit 1
    fi
done
lap build

echo "==> installing $(basename "$wheel") into a fresh venv (torch==$TORCH_VERSION pinned)"
"${pip[@]}" install "${fast[@]}" "torch==$TORCH_VERSION" 2> >(grep -v '^WARNING: Location' >&2)
installed=$("$WORK/venv/bin/python" -W ignore -c "import torch; print(torch.__version__)")
echo "torch==$installed" > "$WORK/constraints.txt"
"${pip[@]}" install "${fast[@]}" -c "$WORK/constraints.txt" "$wheel" 2> >(grep -v '^WARNING: Location' >&2)
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
