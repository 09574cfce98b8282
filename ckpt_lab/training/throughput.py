"""Throughput at equal global batch: a checkpointed larger micro-batch against accumulation.

One optimizer step of G rows can run as k micro-batches of G / k rows (gradient accumulation)
under any checkpoint policy; every choice computes the same update. Under a memory budget,
checkpointing frees memory for a larger micro-batch (fewer, larger operations: per-op overhead
amortised, better use of wide hardware) and pays one more forward of what it recomputes;
accumulation adds no FLOPs but runs smaller micro-batches. Which is faster is a measurement:

* `step_peak_bytes`: the peak of one micro-batch's forward + backward under a policy, with
  the parameter gradients allocated beforehand (they are model state, which the budget must
  leave room for beside this), so every micro-batch of a step peaks the same.
* `largest_micro_batch`: the largest divisor of the global batch whose peak fits a budget
  (bisection over the divisors: the peak grows with the micro-batch).
* `budget_setups`: the setups worth comparing for a budget: no checkpoint at the largest
  micro-batch that fits and at a smaller one (more accumulation), full checkpointing at the
  largest micro-batch it allows and at no checkpoint's, selective recomputation at its largest.
* `measure_throughput`: tokens per second of each setup over the same optimizer steps of
  `ckpt_lab.train` (untracked, setups interleaved round by round, median), with its peak,
  its FLOPs per step (``FlopCounterMode``: matmuls and attention, recompute included) and
  whether it fits.
"""
from __future__ import annotations

import contextlib
import gc
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..measure.memory import track_memory
from .loop import make_optimizer, train


@dataclass(frozen=True)
class Setup:
    """One way to run an optimizer step of the global batch: a policy and a micro-batch."""

    policy: str
    micro_batch: int
    label: str = ""


@dataclass
class ThroughputRow:
    """What one setup measured: median step time and tokens per second, peak, FLOPs, fit."""

    label: str
    policy: str
    micro_batch: int
    accumulation: int
    tokens_per_step: int
    seconds: float
    tokens_per_s: float
    peak_bytes: int
    step_flops: int
    fits: bool | None
    times: list[float] = field(default_factory=list)


def micro_batch_sizes(global_batch: int) -> list[int]:
    """The micro-batch sizes that split a global batch evenly (its divisors), ascending."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be a positive int, got {global_batch!r}")
    return [m for m in range(1, global_batch + 1) if global_batch % m == 0]


def _check_micro_batch(micro_batch, global_batch: int):
    if micro_batch not in micro_batch_sizes(global_batch):
        raise ValueError(f"micro_batch must divide the global batch of {global_batch} rows: "
                         f"one of {micro_batch_sizes(global_batch)}, got {micro_batch!r}")


@contextlib.contextmanager
def _gradients_allocated(model):
    """Zeroed parameter gradients for the block (model state); the old ones put back after."""
    params = list(model.parameters())
    old = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    try:
        yield
    finally:
        for p, g in zip(params, old):
            p.grad = g


def _forward_backward(model, x, y):
    model(x, y).backward()


def step_peak_bytes(model, x, y, policy, micro_batch: int,
                    limit_bytes: int | None = None) -> int:
    """Exact peak bytes of one micro-batch (the first ``micro_batch`` rows of x, y) forward +
    backward under ``policy``, parameter gradients allocated beforehand.

    With ``limit_bytes`` it stops with `SimulatedOutOfMemoryError` as soon as the live bytes
    pass the limit (what `largest_micro_batch` uses to give up early).
    """
    _check_micro_batch(micro_batch, len(x))
    model.set_policy(policy)
    model.train()
    with _gradients_allocated(model):
        with track_memory(limit_bytes=limit_bytes) as mem:
            _forward_backward(model, x[:micro_batch], y[:micro_batch])
    return mem.peak_bytes


def _fits(model, x, y, policy, micro_batch: int, budget_bytes: int) -> bool:
    try:
        step_peak_bytes(model, x, y, policy, micro_batch, limit_bytes=budget_bytes)
        return True
    except torch.OutOfMemoryError:       # simulated, or a real one on CUDA
        if x.is_cuda:                    # free the failed step's device memory before the next
            gc.collect()
            torch.cuda.empty_cache()
        return False


def largest_micro_batch(model, x, y, policy, budget_bytes: int) -> int | None:
    """The largest micro-batch (a divisor of ``len(x)``) whose `step_peak_bytes` under
    ``policy`` stays within ``budget_bytes``; None if not even one row fits."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
    sizes = micro_batch_sizes(len(x))
    lo, hi = -1, len(sizes)          # sizes[lo] fits (or lo = -1), sizes[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(model, x, y, policy, sizes[mid], budget_bytes):
            lo = mid
        else:
            hi = mid
    return sizes[lo] if lo >= 0 else None


def _smaller(micro_batch: int, global_batch: int) -> int | None:
    below = [m for m in micro_batch_sizes(global_batch) if m < micro_batch]
    return below[-1] if below else None


def budget_setups(model, x, y, budget_bytes: int, reference: bool = False) -> list[Setup]:
    """The setups to compare at the global batch ``len(x)`` for a budget (see the module
    docstring); those that cannot fit are left out, and selective recomputation where the
    model has no attention core.

    reference=True adds no checkpoint at full checkpointing's largest micro-batch: over the
    budget, it reads what the larger micro-batch buys by itself (it must fit the device for
    real, so use it with a simulated budget).
    """
    policies = ["none", "every"] + (["selective"] if hasattr(model.blocks()[0], "attn") else [])
    largest = {p: largest_micro_batch(model, x, y, p, budget_bytes) for p in policies}
    setups = []
    none, every = largest["none"], largest["every"]
    if none is not None:
        setups.append(Setup("none", none, "no checkpoint, largest micro-batch that fits"))
        smaller = _smaller(none, len(x))
        if smaller is not None:
            setups.append(Setup("none", smaller, "no checkpoint, smaller micro-batch "
                                                 "(more accumulation)"))
    if every is not None:
        setups.append(Setup("every", every, "full checkpointing, largest micro-batch "
                                            "that fits"))
        if none is not None and none != every:
            setups.append(Setup("every", none, "full checkpointing at no checkpoint's "
                                               "micro-batch"))
    if largest.get("selective") is not None:
        setups.append(Setup("selective", largest["selective"], "selective recomputation, "
                                                               "largest micro-batch that fits"))
    if reference and every is not None and every != none:
        setups.append(Setup("none", every, "no checkpoint at checkpointing's micro-batch "
                                           "(reference, over the budget)"))
    return setups


def step_flops(model, x, y, policy, micro_batch: int) -> int:
    """FLOPs of one optimizer step's forward + backward at the global batch ``len(x)``
    (``FlopCounterMode``: one micro-batch counted, times the micro-batches; recompute included)."""
    _check_micro_batch(micro_batch, len(x))
    model.set_policy(policy)
    with _gradients_allocated(model), FlopCounterMode(display=False) as counter:
        _forward_backward(model, x[:micro_batch], y[:micro_batch])
    return counter.get_total_flops() * (len(x) // micro_batch)


CLOCKS = ("wall", "cpu")


def measure_throughput(model, batches, setups, budget_bytes: int | None = None,
                       repeats: int = 3, warmup: int = 1, device=None,
                       clock: str = "wall") -> list[ThroughputRow]:
    """Tokens per second of each setup at the global batch ``batches.batch_size``.

    Each round runs one optimizer step of every setup (rotating their order) with
    `ckpt_lab.train` on the same batch, untracked; the first ``warmup`` rounds are not timed,
    the reported time is the median of ``repeats``. The setups share one AdamW optimizer (its
    state is model state, allocated once). Peak and FLOPs are measured on the first batch.
    clock: "wall" (train's own step time, synchronised on CUDA: what throughput means) or
    "cpu" (this process's CPU time around each train call: on a CPU shared with other
    programs and torch on one thread, the work a step costs, which they do not inflate).
    """
    for name, v, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    setups = list(setups)
    if not setups:
        raise ValueError("measure_throughput needs at least one Setup")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    global_batch = batches.batch_size
    for s in setups:
        _check_micro_batch(s.micro_batch, global_batch)
    x, y = (t.to(device) for t in batches.get(0))
    peaks = [step_peak_bytes(model, x, y, s.policy, s.micro_batch) for s in setups]
    flops = [step_flops(model, x, y, s.policy, s.micro_batch) for s in setups]
    optimizer = make_optimizer(model)
    times: list[list[float]] = [[] for _ in setups]
    for r in range(warmup + repeats):
        order = list(range(len(setups)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            s = setups[i]
            start = time.process_time()
            run = train(model, batches, 1, policy=s.policy,
                        micro_batches=global_batch // s.micro_batch, optimizer=optimizer,
                        start_step=r, device=device, progress=False, measure_memory=False)
            cpu = time.process_time() - start
            if r >= warmup:
                times[i].append(run.records[0].seconds if clock == "wall" else cpu)
    tokens = batches.tokens_per_batch()
    rows = []
    for s, peak, f, ts in zip(setups, peaks, flops, times):
        seconds = statistics.median(ts)
        rows.append(ThroughputRow(
            label=s.label or f"{s.policy}, micro-batch {s.micro_batch}", policy=s.policy,
            micro_batch=s.micro_batch, accumulation=global_batch // s.micro_batch,
            tokens_per_step=tokens, seconds=seconds, tokens_per_s=tokens / seconds,
            peak_bytes=peak, step_flops=f,
            fits=None if budget_bytes is None else peak <= budget_bytes, times=ts))
    return rows
