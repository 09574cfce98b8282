"""The course's committed GPU runs (``benchmarks/results/gpu/*.json``), read where they exist.

A lesson that makes a point depending on scale (a time ratio, GiB) shows the H200 figures
from these files beside its own CPU run, labelled "H200 (committed run)", instead of typing
them in. They sit in a checkout of the repository, not in the wheel: on Colab without a clone
`gpu_result` returns None and the lesson shows its own run only.
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
