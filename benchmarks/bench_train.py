"""What checkpointing costs a GPT training step: time, peak memory and counted FLOPs.

For the GPT preset and the policies none, every block, every 2nd block and selective
(attention core only), one run measures the forward + backward time (median of paired,
rotating repeats after warm-up), the exact peak from `track_memory`, and the FLOPs that
``torch.utils.flop_counter.FlopCounterMode`` counts around forward + backward (matmuls and
attention; element-wise ops are not counted). The expectation to check: full recomputation
adds about one forward, so ~4/3 = 1.33x the FLOPs of a step (forward 1 + backward 2 +
recompute 1); the measured time ratio is reported beside the FLOP ratio.
Run: python -m benchmarks.bench_train [--quick] [--one-thread]  (writes benchmarks/results/train.json)
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab import track_memory
from ckpt_lab.data import TextBatches, load_corpus
from ckpt_lab.models import build_model, get_config

OUT = Path(__file__).parent / "results" / "train.json"
POLICIES = ("none", "every", "every:2", "selective")


def _setup(quick: bool, device: str):
    if device == "cuda":
        preset, batch = ("gpt-cpu", 8) if quick else ("gpt-gpu", 8)
    else:
        preset, batch = ("gpt-tiny", 4) if quick else ("gpt-cpu", 8)
    return preset, get_config(preset), batch


def _fwd_bwd(model, x, y) -> float:
    """One forward + backward; returns its wall time in seconds."""
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    model(x, y).backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


def _flops(model, x, y) -> tuple[int, int]:
    """(forward FLOPs, forward + backward FLOPs, recompute included) as counted by PyTorch."""
    with FlopCounterMode(display=False) as fwd_counter:
        loss = model(x, y)
    forward = fwd_counter.get_total_flops()
    with FlopCounterMode(display=False) as bwd_counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return forward, forward + bwd_counter.get_total_flops()


def main(out_path: Path | None = None, quick: bool = False, threads: int | None = None) -> dict:
    """Measure every policy on the GPT preset, write JSON, and return the result dict.

    threads: CPU threads for torch (None leaves the setting alone; 1 gives steadier times on
    a busy machine, where two threads on two shared cores stall each other).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset, cfg, batch = _setup(quick, device)
    repeats = 5 if quick else 9
    x, y = TextBatches(load_corpus(), batch, cfg.block_size, seed=0).get(0)
    x, y = x.to(device), y.to(device)
    models = {p: build_model(cfg, p).to(device).train() for p in POLICIES}
    rows = {}
    for name, model in models.items():
        for _ in range(2):
            _fwd_bwd(model, x, y)
        with track_memory() as mem:
            _fwd_bwd(model, x, y)
        forward, total = _flops(model, x, y)
        rows[name] = {"peak_bytes": mem.peak_bytes, "cuda_peak_bytes": mem.cuda_peak_bytes,
                      "forward_flops": forward, "step_flops": total, "times": []}
    names = list(models)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rows[name]["times"].append(_fwd_bwd(models[name], x, y))
    base = rows["none"]
    base_time = statistics.median(base["times"])
    for row in rows.values():
        row["median_seconds"] = statistics.median(row.pop("times"))
        row["recompute_flops"] = row["step_flops"] - base["step_flops"]
        row["extra_forwards"] = row["recompute_flops"] / base["forward_flops"]
        row["flop_ratio"] = row["step_flops"] / base["step_flops"]
        row["time_ratio"] = row["median_seconds"] / base_time
        row["peak_ratio"] = row["peak_bytes"] / base["peak_bytes"]
    result = {
        "device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "preset": preset, "config": asdict(cfg), "batch_size": batch, "repeats": repeats,
        "timed": "forward + backward (recompute included), median of paired repeats",
        "expectation": "full recomputation ('every') ~ 4/3 = 1.33x the FLOPs of a step",
        "policies": rows,
    }
    out = Path(out_path) if out_path is not None else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:10s} time {row['median_seconds'] * 1e3:8.1f} ms  x{row['time_ratio']:.2f}"
              f"   FLOPs x{row['flop_ratio']:.3f} ({row['extra_forwards']:.2f} extra forwards)"
              f"   peak {row['peak_bytes'] / 2**20:7.2f} MiB  x{row['peak_ratio']:.2f}")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main(quick="--quick" in sys.argv, threads=1 if "--one-thread" in sys.argv else None)
