"""Time and peak of ckpt_lab.checkpoint (both designs) against torch.utils.checkpoint.

Each repeat runs the variants back to back in a rotating order (paired repeats), after
warm-up; the JSON reports medians, the ratio ours / PyTorch's for time and peak, the goal
(peak within 1%, time within 10%), and what ``determinism_check="fingerprint"`` costs (each
design with and without it; ``paired_time`` is the median of the per-repeat ratios, steadier
than the ratio of medians on a busy machine).

What ``determinism_check="fingerprint"`` cost when last measured here (16 blocks
Linear(512)-GELU-Dropout, batch 256, 4 segments; a 2-core CPU shared with other jobs, one
thread, median of 30 paired ratios of process CPU time): +10.2% step time for
``impl="hooks"`` (it reads every saved tensor twice more), +1.6% for ``impl="reentrant"``
(outputs only); on the quick size (width 128, batch 64) +23% and +11%; in wall clock, 40
repeats at a quieter moment, +10.6% and +2.2%. About the 10% by which the goal lets ckpt_lab
trail ``torch.utils.checkpoint``, which is why the check is off by default (design note 10 in
ckpt_lab/checkpoint/NOTES.md).
Run: python -m benchmarks.bench_checkpoint
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import checkpoint_sequential, track_memory

OUT = Path(__file__).parent / "results" / "checkpoint.json"


def _model(depth: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers)


def _variants(segments: int) -> dict:
    return {
        "ours_hooks": lambda m, x: checkpoint_sequential(m, x, segments=segments, impl="hooks"),
        "ours_reentrant": lambda m, x: checkpoint_sequential(m, x, segments=segments,
                                                            impl="reentrant"),
        # the same with a fingerprint of every recomputed tensor (determinism_check)
        "ours_hooks_fingerprint": lambda m, x: checkpoint_sequential(
            m, x, segments=segments, impl="hooks", determinism_check="fingerprint"),
        "ours_reentrant_fingerprint": lambda m, x: checkpoint_sequential(
            m, x, segments=segments, impl="reentrant", determinism_check="fingerprint"),
        "torch_nonreentrant": lambda m, x: tuc.checkpoint_sequential(m, segments, x,
                                                                     use_reentrant=False),
        "torch_reentrant": lambda m, x: tuc.checkpoint_sequential(m, segments, x,
                                                                  use_reentrant=True),
    }


def _step(run, model, x) -> float:
    start = time.perf_counter()
    run(model, x).square().mean().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(out_path: Path | None = None, quick: bool = False) -> dict:
    """Run the comparison and write it to JSON; returns the result dict."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    depth, width, batch = (8, 128, 64) if quick else (16, 512, 256)
    if device == "cuda":
        depth, width, batch = 24, 4096, 2048
    repeats, segments = (5, 4) if quick else (9, 4)
    model = _model(depth, width).to(device)
    x = torch.randn(batch, width, device=device, requires_grad=True)
    variants = _variants(segments)
    times = {k: [] for k in variants}
    peaks = {}
    for name, run in variants.items():
        for _ in range(2):
            _step(run, model, x)
        with track_memory() as mem:
            _step(run, model, x)
        peaks[name] = mem.peak_bytes
    names = list(variants)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(_step(variants[name], model, x))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "device": device, "torch": torch.__version__,
        "model": {"depth_blocks": depth, "width": width, "batch": batch, "segments": segments},
        "repeats": repeats, "median_seconds": med, "peak_bytes": peaks,
        "ratios": {
            "hooks_vs_torch_nonreentrant": {
                "time": med["ours_hooks"] / med["torch_nonreentrant"],
                "peak": peaks["ours_hooks"] / peaks["torch_nonreentrant"]},
            "reentrant_vs_torch_reentrant": {
                "time": med["ours_reentrant"] / med["torch_reentrant"],
                "peak": peaks["ours_reentrant"] / peaks["torch_reentrant"]},
        },
        # what determinism_check="fingerprint" costs: with / without it, per design
        "fingerprint_cost": {
            impl: {"time": med[f"ours_{impl}_fingerprint"] / med[f"ours_{impl}"],
                   "peak": peaks[f"ours_{impl}_fingerprint"] / peaks[f"ours_{impl}"],
                   "paired_time": statistics.median(
                       a / b for a, b in zip(times[f"ours_{impl}_fingerprint"],
                                             times[f"ours_{impl}"]))}
            for impl in ("hooks", "reentrant")},
        "goal": {"peak_ratio_within": 0.01, "time_ratio_within": 0.10},
    }
    path = Path(out_path) if out_path else OUT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    res = main()
    for k, v in res["ratios"].items():
        print(f"{k:32s} time x{v['time']:.3f}  peak x{v['peak']:.4f}")
    for k, v in res["fingerprint_cost"].items():
        print(f"fingerprint, {k:19s} time x{v['time']:.3f} (paired x{v['paired_time']:.3f})"
              f"  peak x{v['peak']:.4f}")
