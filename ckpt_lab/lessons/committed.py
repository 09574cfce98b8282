"""The course's committed GPU run, read for lessons whose point depends on scale.

`scripts/gpu_check.sh` ran the benchmarks on an H200 and committed what they measured to
``benchmarks/results/gpu/*.json``. A lesson that runs on a CPU shows those figures beside its
own, labelled `label()` ("H200 (committed run)"), read from the file, never typed in. Where the
file is absent (an installation without the repository's benchmarks), every reader returns
None and the lesson says so.
"""
from __future__ import annotations

import json
from pathlib import Path

import ckpt_lab

RESULTS = Path(ckpt_lab.__file__).resolve().parent.parent / "benchmarks" / "results" / "gpu"


def run(name: str = "gpu_check") -> dict | None:
    """The committed result file ``benchmarks/results/gpu/<name>.json``, or None."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def label(name: str = "gpu_check") -> str:
    """How a figure names the committed run: "H200 (committed run)"."""
    found = run(name)
    device = (found or {}).get("device", "GPU")
    return f"{device.split()[-1]} (committed run)"


def policies() -> dict | None:
    """Per checkpoint policy of the committed GPT run: {"FLOPs", "time", "peak"} ratios to
    the plain step, plus "config" (the GPT's sizes) and "batch"; None without the file."""
    found = run()
    if found is None or "policies" not in found:
        return None
    block = found["policies"]
    out = {name: {"FLOPs": r["flop_ratio"], "time": r["time_ratio"], "peak": r["peak_ratio"]}
           for name, r in block["policies"].items()}
    out["config"], out["batch"] = block["config"], block["batch_size"]
    return out


def section(key: str) -> dict | None:
    """One top-level section of the committed gpu_check run ("offload", "precision", ...)."""
    found = run()
    return None if found is None else found.get(key)
