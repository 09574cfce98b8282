"""Time a training step, and the share of it spent in given modules.

`measure_step` runs a step once under `track_memory` (its exact peak and timeline) and times
it untracked (the tracker's bookkeeping would slow the tracked run down). `forward_share`
times the forwards of the modules a checkpoint policy re-runs, during plain steps: one plus
that share is what re-running them costs by itself, the floor under the policy's time ratio.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .memory import MemoryLog, track_memory


@dataclass
class StepMeasurement:
    """One forward + backward: exact peak bytes, the log with its timeline, median seconds."""

    peak_bytes: int
    seconds: float
    log: MemoryLog


def _sync(device):
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure_step(step, repeats: int = 3, device=None) -> StepMeasurement:
    """Run ``step()`` (a forward and backward) once under `track_memory`, then time it.

    Memory comes from the tracked run; time is the median of ``repeats`` untracked runs (the
    tracker's bookkeeping would slow the tracked one down).
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    with track_memory() as log:
        step()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return StepMeasurement(log.peak_bytes, sorted(times)[len(times) // 2], log)


def forward_share(step, modules, repeats: int = 3, device=None) -> float:
    """Median fraction of ``step()``'s time spent in the forward of `modules`.

    With `step` a plain (uncheckpointed) forward + backward and `modules` what a policy
    re-runs, ``1 + share`` is the time ratio re-running them costs by itself, whatever
    the checkpoint implementation: the floor under that policy's measured time ratio, apart
    from what early stopping skips.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    starts, spent = [], []

    def clock() -> float:
        _sync(device)
        return time.perf_counter()

    handles = [h for m in modules for h in (
        m.register_forward_pre_hook(lambda *_: starts.append(clock())),
        m.register_forward_hook(lambda *_: spent.append(clock() - starts.pop())))]
    if not handles:
        raise ValueError("forward_share needs at least one module to time")
    shares = []
    try:
        for _ in range(repeats):
            spent.clear()
            start = clock()
            step()
            shares.append(sum(spent) / (clock() - start))
    finally:
        for h in handles:
            h.remove()
    return sorted(shares)[len(shares) // 2]
