"""torch.compile's own recomputation, and how to measure memory a compiled step uses.

AOTAutograd traces forward and backward into one graph and its min-cut partitioner decides
which intermediates the forward hands to the backward and which the backward recomputes.
It already recomputes cheap pointwise ops; ``torch._functorch.config.activation_memory_budget``
(1.0 = save what is fastest, 0.0 = recompute everything it can) asks it to trade more speed
for memory. `budget_sweep` compiles once per budget and measures each.

Why not `track_memory`: it is a ``TorchDispatchMode``, and while one is active torch.compile
steps aside and runs the module eagerly (measured in the tests: under the tracker the
compiled module runs the eager ATen ops, and its numbers do not move with the budget).
Inductor's kernels also allocate their buffers below the dispatcher. The allocator sees
everything, so `ckpt_lab.allocator.profiled_memory` reads its events through ``torch.profiler`` with
``profile_memory=True``: every allocation and free, with its size, in time order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ckpt_lab.allocator import profiled_memory


@dataclass
class BudgetRow:
    """One compile at one activation memory budget."""

    budget: float
    compile_seconds: float
    kept_bytes: int        # allocated after the forward: what the backward will read
    peak_bytes: int        # highest point of forward + backward
    step_seconds: float    # median of `repeats` compiled steps


def budget_sweep(make_model, x, budgets=(1.0, 0.5, 0.1), backend: str = "inductor",
                 repeats: int = 3) -> list[BudgetRow]:
    """Compile ``make_model()`` once per budget; measure memory with the profiler and time.

    ``backend="inductor"`` generates fused kernels (C++ on CPU, Triton on GPU; the first
    compile takes tens of seconds on a laptop CPU). ``"aot_eager_decomp_partition"`` runs the
    same decompositions and the same min-cut partitioner but executes the partitioned graphs
    eagerly: identical decisions about what to save, without the kernel compile.
    """
    import torch._dynamo
    import torch._functorch.config as functorch_config
    device = x.device.type
    rows = []
    for budget in budgets:
        if not 0.0 <= budget <= 1.0:
            raise ValueError(f"activation_memory_budget must be in [0, 1], got {budget}")
        torch._dynamo.reset()      # one compile per budget: no graph reused across settings
        model = make_model()
        compiled = torch.compile(model, backend=backend)

        def step():
            compiled(x).pow(2).mean().backward()
            model.zero_grad(set_to_none=True)

        with functorch_config.patch(activation_memory_budget=budget):
            start = time.perf_counter()
            step()                 # forward and backward are partitioned here
            compile_seconds = time.perf_counter() - start
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
        rows.append(BudgetRow(budget, compile_seconds, kept, peak, sorted(times)[len(times) // 2]))
    torch._dynamo.reset()
    return rows
