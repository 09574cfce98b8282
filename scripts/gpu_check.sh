#!/usr/bin/env bash
# Every CUDA path of the course on a GPU machine, written to one JSON
# (benchmarks/results/gpu/gpu_check.json): the measurements of benchmarks/gpu_check.py (tracker
# against allocator, offload, fp16, policies, throughput at equal global batch, allocator
# fragmentation with and without expandable segments; seconds per section recorded), then
# every unit test (the CUDA-only ones run here) and every lesson and solution at the GPU sizes
# the notebooks pick by themselves, with their pass/fail counts folded into the same JSON.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (PYTHON, PYTEST_WORKERS and NB_WORKERS may be set,
# workers > 1 need pytest-xdist; TESTS_TIMEOUT and NB_TIMEOUT bound each stage in seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-benchmarks/results/gpu}
mkdir -p "$OUT"
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device; the measurements' logic is tested on CPU by tests/test_gpu_check.py"
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

$PY -m benchmarks.gpu_check --out "$OUT/gpu_check.json"

xdist() { [ "${1:-1}" -gt 1 ] && echo "-p xdist -n $1 --dist loadfile"; }
# Unit tests and lessons run side by side. Unit tests: everything but the browser test (no Chromium on a GPU box).
timeout -s INT -k 20 "${TESTS_TIMEOUT:-1800}" \
$PY -m pytest -v -o addopts="" -p no:cacheprovider $(xdist "${PYTEST_WORKERS:-1}") \
    --ignore=tests/lessons/test_browser.py --junitxml="$OUT/tests.xml" tests > "$OUT/tests.log" 2>&1 &
# Lessons at GPU sizes. The kernel of a CUDA process holds the CUDA libraries in RAM, so the
# resident-memory budget (sized for Binder's CPU kernels) is lifted here; time stays bounded.
CKPT_LAB_NB_BUDGET_MIB=${CKPT_LAB_NB_BUDGET_MIB:-65536} \
CKPT_LAB_NB_BUDGET_JSON="$OUT/notebook_budgets.json" \
timeout -s INT -k 20 "${NB_TIMEOUT:-3600}" \
$PY -m pytest -v -o addopts="" -p no:cacheprovider --nbval-lax --nbval-current-env \
    $(xdist "${NB_WORKERS:-1}") --junitxml="$OUT/notebooks.xml" notebooks > "$OUT/notebooks.log" 2>&1 &
wait   # the two stages share the GPU (plenty of memory) and the CPU cores; timings come first

$PY - "$OUT" <<'PY'
"""Fold the test and notebook results into gpu_check.json."""
import json, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])


def from_log(log: Path) -> dict:
    """Counts from pytest's own lines: one per test with -v, else the -q progress dots."""
    text = log.read_text(errors="replace") if log.exists() else ""
    verbose = re.findall(r"\b(PASSED|FAILED|ERROR|SKIPPED) (\S+::\S+(?: \d+)?)", text)
    if verbose:
        kinds = [k for k, _ in verbose]
        failures = [{"test": t, "message": ""} for k, t in verbose if k in ("FAILED", "ERROR")]
        counts = (kinds.count("PASSED"), kinds.count("FAILED") + kinds.count("ERROR"),
                  kinds.count("SKIPPED"))
    else:
        dots = "".join(re.findall(r"^([.FEsx]+)\s+\[\s*\d+%\]", text, re.M))
        failures = []
        counts = (dots.count("."), dots.count("F") + dots.count("E"), dots.count("s"))
    return {"passed": counts[0], "failed": counts[1], "skipped": counts[2],
            "failures": failures,
            "incomplete": "no junit report: the stage reached its timeout before pytest wrote "
                          "it; counts are read from pytest's progress lines in the log"}
result = json.loads((out / "gpu_check.json").read_text())
for name in ("tests", "notebooks"):
    path = out / f"{name}.xml"
    if not path.exists():   # the stage hit its timeout before pytest wrote the report
        result[name] = from_log(out / f"{name}.log")
        continue
    cases = ET.parse(path).getroot().iter("testcase")
    summary = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "files": {}}
    for case in cases:
        f = case.get("file") or case.get("classname", "")
        kind = ("failed" if case.find("failure") is not None or case.find("error") is not None
                else "skipped" if case.find("skipped") is not None else "passed")
        summary[kind] += 1
        per = summary["files"].setdefault(f, {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0})
        per[kind] += 1
        per["seconds"] = round(per["seconds"] + float(case.get("time", 0)), 2)
        if kind == "failed":
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            summary["failures"].append({"test": f"{case.get('classname')}::{case.get('name')}",
                                        "message": (node.get("message") or "")[:400]})
    result[name] = summary
budgets = out / "notebook_budgets.json"
if budgets.exists():
    result["notebook_budgets"] = json.loads(budgets.read_text())
(out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
print({k: {kk: result[k][kk] for kk in ("passed", "failed", "skipped")}
       for k in ("tests", "notebooks") if "passed" in result[k]})
PY
