"""Measuring a compiled training step: memory from the allocator's events, time, and graphs.

Lesson 13 and ``benchmarks/bench_compile.py`` measure the same way: each builds its compiled
steps (the lesson in its own cells, with ``torch.compile``, ``torch.utils.checkpoint`` and
``torch._functorch.config.activation_memory_budget`` in view; the benchmark from
``ckpt_lab.training.models``) and hands them to `compare`, which compiles every one (first call,
timed, and whether Inductor's caches served it), measures what the forward keeps and the
step's peak, counts the graphs and graph breaks Dynamo made, and then times all of them in
paired, rotating repeats. `timeline` records the allocator's level through one step, forward
and backward apart; `partition` reads what the partitioner chose to save and to recompute.

Which backend: Inductor generates C++ kernels on a CPU, so it needs a C++ compiler there
(`cpp_compiler` looks for the one Inductor would call); on CUDA it generates Triton kernels.
`pick_backend` falls back to ``aot_eager_decomp_partition`` where Inductor cannot run: the
same decompositions and partitioner, its graphs run op by op, unfused.

One trap of measuring several variants in one process: Dynamo keeps the graphs it makes on the
code object it traces, and picks one by its guards; the activation memory budget is read once,
when AOTAutograd partitions a new graph, and is no guard. Two variants that trace the same code
(a model compiled twice, one function with two budgets) share the first one's graph, whatever
the second one's budget. `own_code` gives each variant a copy of the code, so each compiles.

Why not `track_memory`: it is a ``TorchDispatchMode``, and while one is active torch.compile
steps aside and runs the module eagerly (measured in the tests: under the tracker the
compiled module runs the eager ATen ops, and its numbers do not move with the budget).
Inductor's kernels also allocate their buffers below the dispatcher. The allocator sees
everything, so `ckpt_lab.measure.allocator.profiled_memory` reads its events through ``torch.profiler``
with ``profile_memory=True``: every allocation and free, with its size, in time order.
"""
from __future__ import annotations

import itertools
import os
import shutil
import statistics
import sys
import time
import types
from dataclasses import dataclass

import torch

from ckpt_lab.measure.allocator import AllocatorRecording, op_mark, profiled_memory

FALLBACK = "aot_eager_decomp_partition"


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor calls for CPU kernels (``$CXX``, else g++; clang++ on macOS),
    as a path, or None where there is none."""
    default = "clang++" if sys.platform == "darwin" else "g++"
    return shutil.which(os.environ.get("CXX", default))


def pick_backend(device) -> tuple[str, str]:
    """(backend, why): Inductor on CUDA or where a C++ compiler is present, else the fallback."""
    if torch.device(device).type == "cuda":
        return "inductor", "CUDA: Inductor generates Triton kernels"
    cxx = cpp_compiler()
    if cxx:
        return "inductor", f"a C++ compiler ({cxx}) builds Inductor's CPU kernels"
    return FALLBACK, ("no C++ compiler ($CXX or g++): Inductor cannot build CPU kernels here, so "
                      f"{FALLBACK} runs instead: the same partitioner, graphs run op by op")


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


def _counts() -> tuple[int, int, int, int]:
    from torch._dynamo.utils import counters
    return (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()),
            counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])


def _cache(hits: int, misses: int) -> str | None:
    """What Inductor's graph cache did for a compile: "miss" (compiled), "hit" (loaded), or
    None where no Inductor graph was made (another backend, or nothing new to compile)."""
    return "miss" if misses else "hit" if hits else None


def measure(forward, model, device: str = "cpu", warmup: int = 2) -> dict:
    """Compile and measure one step, ``forward()`` -> a loss, then backward, then zero_grad.

    Returns the first step's seconds (compiling included), the bytes still allocated after a
    forward (the loss held: what the backward will read), the step's peak, the graphs and
    graph breaks Dynamo made meanwhile (a graph break can recompile once, so the warm-up steps
    count too), and ``inductor_cache``: "miss" when Inductor compiled a graph, "hit" when its
    on-disk cache served every one, None for other backends."""
    def step():
        forward().backward()
        model.zero_grad(set_to_none=True)

    before = _counts()
    first = timed(step, device)
    for _ in range(warmup):
        step()
    held = []
    kept = profiled_memory(lambda: held.append(forward()), device).end_bytes
    held.pop().backward()
    model.zero_grad(set_to_none=True)
    peak = profiled_memory(step, device).peak_bytes
    graphs, breaks, hits, misses = (int(a - b) for a, b in zip(_counts(), before))
    return {"first_step_seconds": first, "kept_bytes": kept, "peak_bytes": peak,
            "graphs": graphs, "graph_breaks": breaks, "inductor_cache": _cache(hits, misses),
            "step": step}


def compare(variants: dict, device: str = "cpu", repeats: int = 5, warmup: int = 2) -> dict:
    """``variants``: {name: (forward, model)}. Every one is compiled and measured (`measure`),
    then timed in `repeats` rounds, each in a rotated order so that no variant always runs
    first; each row gets its ``median_step_seconds`` and ``compile_seconds``, the first step's
    time less a median step: what compiling (or loading from the cache) added."""
    rows = {name: measure(forward, model, device, warmup)
            for name, (forward, model) in variants.items()}
    names, times = list(rows), {name: [] for name in rows}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(rows[name]["step"], device))
    for name, row in rows.items():
        del row["step"]
        row["median_step_seconds"] = statistics.median(times[name])
        row["compile_seconds"] = max(0.0, row["first_step_seconds"] - row["median_step_seconds"])
    return rows


@dataclass
class Timeline:
    """The allocator's bytes after each of its events through one step, from the step's start,
    and how many of those events the forward made (the rest are the backward's)."""

    live_bytes: list[int]
    forward_events: int

    @property
    def peak_bytes(self) -> int:
        """The step's peak: the highest point of `live_bytes`."""
        return max(self.live_bytes, default=0)

    @property
    def peak_share_of_backward(self) -> float:
        """Where the peak falls in the backward: 0 at its first event, 1 at its last (below 0:
        in the forward)."""
        at = self.live_bytes.index(self.peak_bytes)
        length = len(self.live_bytes) - self.forward_events
        return (at - self.forward_events) / max(length - 1, 1)


def timeline(forward, model, device: str = "cpu") -> Timeline:
    """Record one step (``forward()`` -> a loss, then backward) of an already compiled step
    from the allocator's events; zero_grad after it."""
    with AllocatorRecording(cuda_activity=device == "cuda") as rec:
        with op_mark(0):
            loss = forward()
        with op_mark(1):
            loss.backward()
    model.zero_grad(set_to_none=True)
    end_of_forward = rec.marks[0][1]
    live, level, forward_events = [], 0, 0
    for t, nbytes, dev in rec.events:
        if dev.split(":")[0] != device:
            continue
        level += nbytes
        live.append(level)
        forward_events += t <= end_of_forward
    return Timeline(live, forward_events)


def measure_step(compiled, model, x, repeats: int = 3) -> CompiledStep:
    """Kept bytes, peak and time of ``compiled(x).pow(2).mean().backward()``, already compiled."""
    device = x.device.type
    row = compare({"step": (lambda: compiled(x).pow(2).mean(), model)}, device, repeats,
                  warmup=0)["step"]
    return CompiledStep(row["kept_bytes"], row["peak_bytes"], row["median_step_seconds"])


MATMULS = ("mm", "addmm", "bmm", "baddbmm")


def partition(fn, args, budget: float) -> dict:
    """What AOTAutograd's partitioner decides for ``fn(*args)`` (a loss) at an activation memory
    budget, under ``aot_eager_decomp_partition``'s decompositions and partitioner: the bytes
    the forward graph saves for backward besides the inputs (parameters included), the
    matmuls of the forward, and those the backward graph runs again. Like the partitioner's
    own debug log, an operation counts as recomputed when the backward graph holds a node of
    the forward's name; ``recomputed_before_first_gradient`` counts the recomputed matmuls the
    backward graph runs before its first matmul of a gradient. Compiles a fresh copy of ``fn``
    (`own_code`); its graphs run eagerly, so no kernel is generated."""
    import functools

    import torch._functorch.config as functorch_config
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._inductor.compile_fx import select_decomp_table

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return boxed_nop(gm, example_inputs)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, decompositions=select_decomp_table(),
                           partition_fn=functools.partial(min_cut_rematerialization_partition,
                                                          compiler="inductor"))
    with functorch_config.patch(activation_memory_budget=budget, unlift_effect_tokens=True):
        torch.compile(own_code(fn), backend=backend)(*args).backward()
    if len(graphs) != 2:
        raise ValueError(f"expected one forward and one backward graph, got {len(graphs)}: "
                         "give a function Dynamo captures whole")
    fw, bw = graphs

    def calls(gm):
        return {n.name: n for n in gm.graph.nodes if n.op == "call_function"}

    def is_matmul(node):
        return getattr(node.target, "__name__", "").split(".")[0] in MATMULS

    saved = list(fw.graph.find_nodes(op="output"))[0].args[0][1:]
    inputs = {n.name for n in fw.graph.find_nodes(op="placeholder")}
    saved_bytes = sum(v.numel() * v.element_size() for n in saved
                      if getattr(n, "name", None) not in inputs
                      and isinstance(v := getattr(n, "meta", {}).get("val"), torch.Tensor))
    fw_calls, bw_calls = calls(fw), calls(bw)
    order = [name in fw_calls for name, n in bw_calls.items() if is_matmul(n)]   # True: a recompute
    return {"saved_bytes": saved_bytes,
            "forward_matmuls": sum(map(is_matmul, fw_calls.values())),
            "recomputed_matmuls": sum(order),
            "recomputed_before_first_gradient": order.index(False) if False in order else len(order)}
