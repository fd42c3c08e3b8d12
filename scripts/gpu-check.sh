#!/usr/bin/env bash
# One command for a GPU machine: the whole test suite, then the `gpu` lane (tests/test_gpu.py:
# the embedded engine on CUDA, an FSDP2 training step, a weight push into a server on the same
# GPU, a Qwen2.5-0.5B-shape GRPO step, resume across strategies), then the GRPO step benchmark
# on the 0.5B shape, and a summary of all three.
#
# Without a CUDA GPU it says so, runs the CPU suite (the gpu lane skips itself) and exits with
# the suite's status, so CI may call it anywhere.
#
#   bash scripts/gpu-check.sh                  # the python: $PYTHON, else .venv/bin/python, else python3
#   bash scripts/gpu-check.sh --lane-only      # skip the whole suite (the gpu lane and the benchmark only)
#   AGENTGYM_WHEELS=DIR bash scripts/gpu-check.sh
#       first installs what the python lacks (gymnasium, ray, fastapi, ...) from the wheels in DIR,
#       with no network and the machine's torch pinned: for GPU images that have torch but not these
#   pytest arguments after `--` go to every pytest run (e.g. `-- -x`)
#
# The summary is printed and written to $AGENTGYM_GPU_SUMMARY (default: $OUT/gpu-check-summary.txt
# when $OUT is set, else gpu-check-summary.txt), with the junit files beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_ONLY=0
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --lane-only) LANE_ONLY=1 ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        *) echo "usage: bash scripts/gpu-check.sh [--lane-only] [-- PYTEST ARGS]" >&2; exit 2 ;;
    esac
    shift
done
if [ -n "${PYTHON:-}" ]; then :
elif [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python
else PYTHON=python3; fi
SUMMARY="${AGENTGYM_GPU_SUMMARY:-${OUT:+$OUT/}gpu-check-summary.txt}"
REPORTS="$(dirname "$SUMMARY")"
mkdir -p "$REPORTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_AUTH_MODE=disabled

if [ -n "${AGENTGYM_WHEELS:-}" ]; then
    echo "==> installing what $PYTHON lacks from $AGENTGYM_WHEELS (no network, torch pinned)"
    torch_version=$("$PYTHON" -c "import torch; print(torch.__version__)") || exit 1
    constraints="$(mktemp)"
    echo "torch==$torch_version" > "$constraints"
    "$PYTHON" -m pip install -q --no-index --find-links "$AGENTGYM_WHEELS" -c "$constraints" \
        gymnasium ray fastapi "uvicorn[standard]" omegaconf openai pyyaml psutil pytest pytest-asyncio || exit 1
fi

"$PYTHON" - <<'EOF' || exit 1
import importlib.util, sys
missing = [m for m in ("torch", "gymnasium", "ray", "fastapi", "uvicorn", "omegaconf", "openai", "transformers",
                       "pytest", "pytest_asyncio") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"{sys.executable} lacks {', '.join(missing)}: install them (bash scripts/setup.sh), or bring wheels "
             "and set AGENTGYM_WHEELS=DIR (see ../shared/MACHINE-NOTES.md for carrying them to a GPU machine)")
EOF
GPU=$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
ENVIRONMENT=$("$PYTHON" -c "import platform, torch; print(f'python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}')")
status=0
runs=()

run_pytest() {  # name, then pytest arguments
    local name="$1"; shift
    echo "==> pytest ($name): $*"
    "$PYTHON" -m pytest -q -ra --junitxml="$REPORTS/gpu-check-$name.xml" "$@" "${PYTEST_ARGS[@]}" || status=1
    runs+=("$name")
}

if [ -z "$GPU" ]; then
    echo "==> no CUDA GPU is visible to $PYTHON ($ENVIRONMENT): the gpu lane cannot run here."
    echo "    Running the CPU suite; run this script on a GPU machine for the gpu lane."
    [ "$LANE_ONLY" = 1 ] || run_pytest suite -m "not gpu"
else
    echo "==> GPU: $GPU ($ENVIRONMENT)"
    [ "$LANE_ONLY" = 1 ] || run_pytest suite -m "not gpu"
    run_pytest gpu-lane -m gpu
    echo "==> benchmark: a GRPO step on the Qwen2.5-0.5B shape"
    "$PYTHON" benchmarks/train_step.py --models qwen2.5-0.5b-shape --skip-trl --steps 2 \
        > "$REPORTS/gpu-check-benchmark.txt" 2>&1 || status=1
    tail -n 15 "$REPORTS/gpu-check-benchmark.txt"
fi

"$PYTHON" - "$SUMMARY" "$REPORTS" "${GPU:-none}" "$ENVIRONMENT" "${runs[@]}" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

summary, reports, gpu, environment, *runs = sys.argv[1:]
lines = [f"agentgym gpu-check: GPU {gpu}; {environment}"]
if gpu == "none":
    lines.append("no CUDA GPU: the gpu lane did not run")
for run in runs:
    root = ET.parse(Path(reports) / f"gpu-check-{run}.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = suite.findall("testcase")
    outcome = {}
    for case in cases:
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        detail = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
        outcome[name] = (kind, float(case.get("time", 0)), detail)
    counts = {k: sum(v[0] == k for v in outcome.values()) for k in ("passed", "failure", "error", "skipped")}
    lines.append(f"{run}: {counts['passed']} passed, {counts['failure']} failed, {counts['error']} errors, "
                 f"{counts['skipped']} skipped in {float(suite.get('time', 0)):.0f} s")
    for name, (kind, seconds, detail) in outcome.items():
        if run == "gpu-lane" or kind in ("failure", "error"):
            lines.append(f"  {kind:8s} {seconds:7.1f} s  {name}" + (f"  ({detail.splitlines()[0][:160]})"
                                                                     if detail and kind != "passed" else ""))
bench = Path(reports) / "gpu-check-benchmark.txt"
if bench.is_file():
    lines.append("benchmark (benchmarks/train_step.py, 0.5B shape):")
    lines += ["  " + line for line in bench.read_text().splitlines()[-12:]]
text = "\n".join(lines)
Path(summary).write_text(text + "\n")
print("\n==> summary (" + summary + ")\n" + text)
EOF
exit $status
