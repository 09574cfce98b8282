"""Measuring a compiled training step: memory from the allocator's events, and time.

Lesson 11 sets ``torch._functorch.config.activation_memory_budget`` and calls
``torch.compile`` in its own cells; `measure_step` measures the compiled step it is given.

Why not `track_memory`: it is a ``TorchDispatchMode``, and while one is active torch.compile
steps aside and runs the module eagerly (measured in the tests: under the tracker the
compiled module runs the eager ATen ops, and its numbers do not move with the budget).
Inductor's kernels also allocate their buffers below the dispatcher. The allocator sees
everything, so `ckpt_lab.allocator.profiled_memory` reads its events through ``torch.profiler``
with ``profile_memory=True``: every allocation and free, with its size, in time order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ckpt_lab.allocator import profiled_memory  # noqa: F401  (compiled.profiled_memory)


@dataclass
class CompiledStep:
    """One compiled training step, measured after its first (compiling) call."""

    kept_bytes: int        # allocated after the forward: what the backward will read
    peak_bytes: int        # highest point of forward + backward
    step_seconds: float    # median of `repeats` steps


def measure_step(compiled, model, x, repeats: int = 3) -> CompiledStep:
    """Kept bytes, peak and time of ``compiled(x).pow(2).mean().backward()``, already compiled."""
    device = x.device.type

    def step():
        compiled(x).pow(2).mean().backward()
        model.zero_grad(set_to_none=True)

    held = {}
    kept = profiled_memory(lambda: held.setdefault("loss", compiled(x).pow(2).mean()),
                           device).end_bytes
    held.pop("loss").backward()
    model.zero_grad(set_to_none=True)
    peak = profiled_memory(step, device).peak_bytes
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return CompiledStep(kept, peak, sorted(times)[len(times) // 2])
