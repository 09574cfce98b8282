"""The course's committed GPU runs (``benchmarks/results/gpu/*.json``), read where they exist.

A lesson that makes a point depending on scale (a time ratio, GiB) shows the H200 figures
from these files beside its own CPU run, labelled "H200 (committed run)" (`label`), instead of
typing them in. They sit in a checkout of the repository, not in the wheel: on Colab without a
clone every reader returns None and the lesson shows its own run only.
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu"


def gpu_result(name: str) -> dict | None:
    """The committed GPU run ``benchmarks/results/gpu/<name>.json``, or None where it is absent."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def full_recompute_ratios(run: dict) -> dict[str, float]:
    """Peak, FLOPs and time of checkpointing every block over none, from a ``train`` run."""
    every = run["policies"]["every"]
    return {"peak": every["peak_ratio"], "FLOPs": every["flop_ratio"], "time": every["time_ratio"]}


def label(name: str = "gpu_check") -> str:
    """How a figure names the committed run: "H200 (committed run)"."""
    found = gpu_result(name)
    device = (found or {}).get("device", "GPU")
    return f"{device.split()[-1]} (committed run)"


def policies() -> dict | None:
    """Per checkpoint policy of the committed GPT run (gpu_check): {"FLOPs", "time", "peak"}
    ratios to the plain step, plus "config" (the GPT's sizes) and "batch"; None without it."""
    found = gpu_result("gpu_check")
    if found is None or "policies" not in found:
        return None
    block = found["policies"]
    out = {name: {"FLOPs": r["flop_ratio"], "time": r["time_ratio"], "peak": r["peak_ratio"]}
           for name, r in block["policies"].items()}
    out["config"], out["batch"] = block["config"], block["batch_size"]
    return out


def section(key: str) -> dict | None:
    """One top-level section of the committed gpu_check run ("offload", "precision", ...)."""
    found = gpu_result("gpu_check")
    return None if found is None else found.get(key)
