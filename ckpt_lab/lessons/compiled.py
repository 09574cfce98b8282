"""Measuring a compiled training step: memory from the allocator's events, time, and graphs.

Lesson 11 and ``benchmarks/bench_compile.py`` measure the same way: each builds its compiled
steps (the lesson in its own cells, with ``torch.compile``, ``torch.utils.checkpoint`` and
``torch._functorch.config.activation_memory_budget`` in view; the benchmark from
``ckpt_lab.models``) and hands them to `compare`, which compiles every one (first call,
timed), measures what the forward keeps and the step's peak, counts the graphs and graph
breaks Dynamo made, and then times all of them in paired, rotating repeats.

One trap of measuring several variants in one process: Dynamo keeps the graphs it makes on the
code object it traces, and picks one by its guards; the activation memory budget is read once,
when AOTAutograd partitions a new graph, and is no guard. Two variants that trace the same code
(a model compiled twice, one function with two budgets) share the first one's graph, whatever
the second one's budget. `own_code` gives each variant a copy of the code, so each compiles.

Why not `track_memory`: it is a ``TorchDispatchMode``, and while one is active torch.compile
steps aside and runs the module eagerly (measured in the tests: under the tracker the
compiled module runs the eager ATen ops, and its numbers do not move with the budget).
Inductor's kernels also allocate their buffers below the dispatcher. The allocator sees
everything, so `ckpt_lab.allocator.profiled_memory` reads its events through ``torch.profiler``
with ``profile_memory=True``: every allocation and free, with its size, in time order.
"""
from __future__ import annotations

import itertools
import statistics
import time
import types
from dataclasses import dataclass

import torch

from ckpt_lab.allocator import profiled_memory


@dataclass
class CompiledStep:
    """One compiled training step, measured after its first (compiling) call."""

    kept_bytes: int        # allocated after the forward: what the backward will read
    peak_bytes: int        # highest point of forward + backward
    step_seconds: float    # median of `repeats` steps


_copies = itertools.count()


def own_code(fn):
    """``fn`` with a code object of its own, for ``torch.compile``: its graphs are its own."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_copies)}")
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def timed(step, device: str) -> float:
    """Wall seconds of one call of ``step()`` (synchronized on CUDA)."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def measure(forward, model, device: str = "cpu", warmup: int = 2) -> dict:
    """Compile and measure one step, ``forward()`` -> a loss, then backward, then zero_grad.

    Returns the first step's seconds (compiling included), the bytes still allocated after a
    forward (the loss held: what the backward will read), the step's peak, and the graphs and
    graph breaks Dynamo made meanwhile (a graph break can recompile once, so the warm-up steps
    count too)."""
    def step():
        forward().backward()
        model.zero_grad(set_to_none=True)

    graphs, breaks = _counts()
    first = timed(step, device)
    for _ in range(warmup):
        step()
    held = []
    kept = profiled_memory(lambda: held.append(forward()), device).end_bytes
    held.pop().backward()
    model.zero_grad(set_to_none=True)
    peak = profiled_memory(step, device).peak_bytes
    graphs_now, breaks_now = _counts()
    return {"first_step_seconds": first, "kept_bytes": kept, "peak_bytes": peak,
            "graphs": int(graphs_now - graphs), "graph_breaks": int(breaks_now - breaks),
            "step": step}


def compare(variants: dict, device: str = "cpu", repeats: int = 5, warmup: int = 2) -> dict:
    """``variants``: {name: (forward, model)}. Every one is compiled and measured (`measure`),
    then timed in `repeats` rounds, each in a rotated order so that no variant always runs
    first; each row gets its ``median_step_seconds``."""
    rows = {name: measure(forward, model, device, warmup)
            for name, (forward, model) in variants.items()}
    names, times = list(rows), {name: [] for name in rows}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(rows[name]["step"], device))
    for name, row in rows.items():
        del row["step"]
        row["median_step_seconds"] = statistics.median(times[name])
    return rows


def measure_step(compiled, model, x, repeats: int = 3) -> CompiledStep:
    """Kept bytes, peak and time of ``compiled(x).pow(2).mean().backward()``, already compiled."""
    device = x.device.type
    row = compare({"step": (lambda: compiled(x).pow(2).mean(), model)}, device, repeats,
                  warmup=0)["step"]
    return CompiledStep(row["kept_bytes"], row["peak_bytes"], row["median_step_seconds"])
