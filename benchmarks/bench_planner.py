"""What the planner's vectorised step model buys: the readable form against the tables.

`ckpt_lab.plan.step_model.StepModel` writes a step's peak out one segment at a time
(`segment_peak`, `kept`, `last_segment_peak`); `StepModel.tables` computes the same numbers for
every segment of the chain with numpy. The planner needs every segment (its programme tries
every start for every end, at every budget of a bisection), so this times both ways of getting
them on chains of n layers, and a whole `optimal_segments` call on the tables. The profile is
a measured one (`profile_layers` of a small MLP chain), repeated to n layers.
Run: python -m benchmarks.bench_planner
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ckpt_lab import planner, profile_layers
from ckpt_lab.plan.step_model import StepModel

OUT = Path(__file__).parent / "results" / "planner.json"


def measured_profile(n: int) -> list:
    """A profile of n layers: a measured 8-layer MLP chain's, repeated."""
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(8)])
    base = profile_layers(layers, torch.randn(16, 64, requires_grad=True), repeats=1)
    return [replace(base[i % len(base)], name=str(i)) for i in range(n)]


def readable_seconds(model: StepModel) -> float:
    """Every segment's numbers, one call at a time."""
    start = time.perf_counter()
    for a in range(model.n - 1):
        for b in range(a + 1, model.n):
            model.segment_peak(a, b)
            model.kept(a, b)
    for t in range(model.n):
        model.last_segment_peak(t)
    return time.perf_counter() - start


def main(out_path: Path = OUT, quick: bool = False) -> dict:
    sizes = (20, 50) if quick else (50, 100, 200, 1000)
    readable_up_to = 50 if quick else 200
    rows = []
    for n in sizes:
        prof = measured_profile(n)
        model = StepModel(prof)
        start = time.perf_counter()
        model.tables()
        tables = time.perf_counter() - start
        budget = int(1.3 * planner.minimum_peak(prof))
        start = time.perf_counter()
        planner.optimal_segments([replace(p) for p in prof], budget)
        plan = time.perf_counter() - start
        rows.append({"layers": n, "tables_seconds": tables, "optimal_segments_seconds": plan,
                     "readable_seconds": readable_seconds(model) if n <= readable_up_to else None})
        print(rows[-1], flush=True)
    res = {"what": "seconds to get every segment's peak of an n-layer chain, readable form and "
                   "numpy tables; and one optimal_segments call (tables)", "rows": rows}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    import sys
    main(quick="--quick" in sys.argv)
