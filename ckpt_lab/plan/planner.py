"""Where to put checkpoints: the cheapest segmentation of a chain that fits a memory budget.

A plan is a list of segment starts beginning with 0, applied by
`checkpoint_sequential(layers, x, boundaries=plan.boundaries)`. Every segment but the last is
checkpointed: it keeps only its input and runs its forward once more in backward. Two
memory models, chosen by what a function is given:

* a profile from `profile_layers(layers, x)`: the step model (`step_model`, whose
  `step_peak_bytes` this module re-exports), the peak `track_memory` measures for one training
  step with the plan, built from measurements of each layer alone; `plan_chain(layers, x,
  budget_bytes)` profiles and plans in one call.
  With ``allocator=True`` both count the allocator's bytes (op temporaries, the generator
  states checkpoints keep) instead of tensor bytes: see `plan_chain`;
* plain lists act_bytes, out_bytes, fwd_cost: the activation model of lesson 3
  (`formulas.segmented_peak_bytes`), saved activations and kept inputs only.

Both have the same shape: a plan's peak is the max over segments j of (kept inputs of the
segments before j + a term of segment j alone), and the last segment's (all kept inputs +
its own term).

Why a plain dynamic programme over cost is not enough, and what is exact instead:

* The recompute cost is the forward cost of every layer before the last segment's start t,
  so for a given t it does not depend on where the other boundaries go. The cheapest plan
  is the one with the smallest feasible t.
* Whether some split of layers [0, t) fits depends on a running quantity, the bytes K kept so
  far: segment [i, k) fits when K + act[i:k] <= budget, and then K grows by the input of i.
  A smaller K at the same position dominates a larger one (every later constraint is
  "K + something <= budget"), so for each position the least reachable K is all we need:
  best[k] = min over i < k with best[i] + act[i:k] <= budget of best[i] + in(i).
  The i that reach k form a window (acts are >= 0), so a heap gives it in O(n log n).
* t is feasible when best[t] + act[t:n] <= budget. Among plans of least cost we return the
  one of least peak, found by bisecting on the budget (peaks are integers).
* In the step model a segment's term is not monotone in its end (a longer segment may receive
  a smaller gradient, or stop its recompute earlier), so there is no window: every term
  segment_peak(i, k) comes from the model's tables (`StepModel.tables`, computed once), and
  each position takes the minimum over all i, O(n^2) per budget in vectorised steps
  (benchmarks/bench_planner.py times it).

The budget's checks, its bisection and `BudgetTooSmallError` are `budget`'s, shared with the
module planner.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import numbers
from dataclasses import dataclass

import numpy as np

from ..checkpoint import segment_starts
from .budget import BudgetTooSmallError, budget_bytes_of, least_budget_where
from .formulas import segmented_peak_bytes
from .step_model import StepModel, step_peak_bytes, whole_bytes

__all__ = ["BudgetTooSmallError", "Plan", "evaluate_plan", "least_budget_where", "minimum_peak",
           "optimal_segments", "pareto_front", "plan_chain", "step_peak_bytes", "uniform_plan"]


@dataclass(frozen=True)
class Plan:
    """Segment starts, the peak bytes they lead to, and the forward cost recomputed."""

    boundaries: list
    peak_bytes: int
    recompute_cost: float

    @property
    def segments(self) -> int:
        """Number of segments (the last one is not checkpointed)."""
        return len(self.boundaries)


class _Searches:
    """Bisections on the budget, shared by both models (feasibility only grows with budget)."""

    def minimum(self) -> int:
        """The least budget any plan fits, by bisection on integer bytes."""
        return least_budget_where(self.lower_bound(), self.no_checkpoint_peak(),
                                  lambda budget: self.plan_at(budget) is not None)

    def least_budget_for(self, cost, lo: int, hi: int) -> int:
        """Least budget in (lo, hi] whose best plan costs <= cost (hi must qualify)."""
        def holds(budget):
            plan = self.plan_at(budget)
            return plan is not None and self.cost_prefix[plan[-1]] <= cost
        return least_budget_where(lo, hi, holds)


class _Chain(_Searches):
    """Validated sizes with prefix sums, shared by every function here."""

    def __init__(self, act_bytes, out_bytes, fwd_cost, input_bytes):
        self.act = whole_bytes("act_bytes", act_bytes)
        self.out = whole_bytes("out_bytes", out_bytes)
        self.cost = _numbers("fwd_cost", fwd_cost)
        n = len(self.act)
        if n == 0:
            raise ValueError("the chain is empty; give one entry per layer")
        if len(self.out) != n or len(self.cost) != n:
            raise ValueError(f"act_bytes, out_bytes and fwd_cost must have one entry per "
                             f"layer; got lengths {n}, {len(self.out)}, {len(self.cost)}")
        self.input = whole_bytes("input_bytes", [input_bytes])[0]
        self.n = n
        self.act_prefix = list(itertools.accumulate(self.act, initial=0))
        self.cost_prefix = list(itertools.accumulate(self.cost, initial=0))

    def kept(self, i: int) -> int:
        """Bytes segment starting at i keeps when checkpointed: its input."""
        return self.input if i == 0 else self.out[i - 1]

    def least_kept(self, budget: int) -> tuple[list, list]:
        """best[i]: least kept bytes with checkpointed segments covering [0, i) (None: cannot),
        and parent[i]: the start of the last of those segments."""
        n, pre = self.n, self.act_prefix
        best, parent = [None] * (n + 1), [None] * (n + 1)
        best[0] = 0
        heap = []  # (kept after a segment starting at i, last end it may reach, i)
        for k in range(n + 1):
            if k > 0:
                while heap and heap[0][1] < k:
                    heapq.heappop(heap)
                if heap:
                    best[k], _, parent[k] = heap[0]
            if k < n and best[k] is not None:
                room = budget - best[k]
                # furthest end e with act[k:e] <= room
                e = bisect.bisect_right(pre, pre[k] + room) - 1
                if e > k:
                    heapq.heappush(heap, (best[k] + self.kept(k), e, k))
        return best, parent

    def plan_at(self, budget: int):
        """The least-cost plan within `budget` (None if none fits)."""
        best, parent = self.least_kept(budget)
        pre = self.act_prefix
        feasible = [t for t in range(self.n) if best[t] is not None
                    and best[t] + pre[self.n] - pre[t] <= budget]
        if not feasible:
            return None
        t = min(feasible, key=lambda t: (self.cost_prefix[t], t))
        starts = [t]
        while starts[-1] > 0:
            starts.append(parent[starts[-1]])
        return starts[::-1]

    def evaluate(self, starts) -> Plan:
        """Peak and recompute cost of given segment starts."""
        peak = segmented_peak_bytes(starts, self.act, self.out, self.input)
        return Plan(list(starts), peak, self.cost_prefix[starts[-1]])

    def no_checkpoint_peak(self) -> int:
        """Peak of running the chain without any checkpoint."""
        return self.act_prefix[self.n]

    def lower_bound(self) -> int:
        """A budget no plan fits (bisections start above it)."""
        return max(self.act) - 1


def _numbers(name: str, values) -> list:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v or v < 0 \
                or v == float("inf"):
            raise ValueError(f"{name}[{i}] must be a finite number >= 0, got {v!r}")
        out.append(int(v) if isinstance(v, numbers.Integral) else float(v))
    return out


def _is_profile(values) -> bool:
    values = list(values) if not isinstance(values, (list, tuple)) else values
    return bool(values) and all(hasattr(v, "act_bytes") for v in values)


def _chain(act_bytes, out_bytes, fwd_cost, input_bytes):
    """The model a call asks for: a profile means the step model, three lists the activation one.

    With a profile, `fwd_cost` (one number per layer) replaces the profiled forward seconds
    as the recompute cost: e.g. each layer's FLOPs, which do not jitter from run to run."""
    if _is_profile(act_bytes):
        if input_bytes:
            raise ValueError("input_bytes belongs to the activation model; the step model counts "
                             "what the step allocates, and x is allocated before it")
        if out_bytes is not None:
            raise ValueError("with a profile, give no out_bytes: the profile holds them "
                             "(pass a per-layer cost as fwd_cost=...)")
        return _StepChain(act_bytes, fwd_cost)
    if out_bytes is None or fwd_cost is None:
        raise ValueError("give either a profile (a list of LayerProfile from profile_layers) or "
                         "act_bytes, out_bytes and fwd_cost")
    return _Chain(act_bytes, out_bytes, fwd_cost, input_bytes)


def _optimal(chain, budget_bytes) -> Plan:
    budget = budget_bytes_of(budget_bytes)
    top = chain.no_checkpoint_peak()  # no checkpoint at all fits this, so more buys nothing
    budget = top if budget is None else min(budget, top)
    starts = chain.plan_at(budget)
    if starts is None:
        raise BudgetTooSmallError(budget, chain.minimum())
    cost = chain.cost_prefix[starts[-1]]
    # the least budget with a plan this cheap is at most this plan's own peak
    tight = chain.least_budget_for(cost, chain.lower_bound(), chain.evaluate(starts).peak_bytes)
    return chain.evaluate(chain.plan_at(tight))


def optimal_segments(act_bytes, out_bytes=None, fwd_cost=None, budget_bytes=None,
                     input_bytes=0) -> Plan:
    """The plan of least recompute cost whose peak fits `budget_bytes` (least peak on ties).

    Two models, chosen by what you pass:

    * `optimal_segments(profile, budget_bytes)` with `profile = profile_layers(layers, x)`: the
      step model (`step_peak_bytes`), the measured peak of a training step; the recompute cost
      is the profiled forward time, or `fwd_cost=` (one number per layer, e.g. FLOPs);
    * `optimal_segments(act_bytes, out_bytes, fwd_cost, budget_bytes, input_bytes=0)`: the
      activation model of lesson 3 (`formulas.segmented_peak_bytes`), for hand-made chains.

    Raises BudgetTooSmallError (a ValueError) naming the feasible minimum when nothing fits.
    """
    if _is_profile(act_bytes) and budget_bytes is None:
        budget_bytes, out_bytes = out_bytes, None
    if budget_bytes is None:
        raise ValueError("budget_bytes is missing: optimal_segments(profile, budget_bytes) or "
                         "optimal_segments(act_bytes, out_bytes, fwd_cost, budget_bytes)")
    return _optimal(_chain(act_bytes, out_bytes, fwd_cost, input_bytes), budget_bytes)


def minimum_peak(act_bytes, out_bytes=None, fwd_cost=None, input_bytes=0) -> int:
    """The least peak bytes any segmentation of the chain reaches (recompute cost ignored)."""
    if not _is_profile(act_bytes) and fwd_cost is None:
        fwd_cost = [0] * len(list(act_bytes))
    return _chain(act_bytes, out_bytes, fwd_cost, input_bytes).minimum()


def evaluate_plan(boundaries, act_bytes, out_bytes=None, fwd_cost=None, input_bytes=0) -> Plan:
    """Peak bytes and recompute cost of the given segment starts (a list beginning with 0)."""
    chain = _chain(act_bytes, out_bytes, fwd_cost, input_bytes)
    starts = list(boundaries)
    if not starts or starts[0] != 0:
        raise ValueError(f"boundaries must begin with 0, got {starts}")
    starts = segment_starts(chain.n, boundaries=starts)
    return chain.evaluate(starts)


def uniform_plan(n: int, segments: int) -> list:
    """Segment starts of checkpoint_sequential(segments=...): size n // segments, last gets the rest."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be an int >= 1 (number of layers), got {n!r}")
    return segment_starts(int(n), segments=segments)


def pareto_front(act_bytes, out_bytes=None, fwd_cost=None, input_bytes=0) -> list:
    """Every budget at which the least recompute cost drops: plans from tightest to none.

    Each entry is the least-peak plan of its cost; peaks rise and costs fall along the list.
    Takes a profile (step model) or act_bytes, out_bytes, fwd_cost (activation model).
    """
    chain = _chain(act_bytes, out_bytes, fwd_cost, input_bytes)
    top = chain.no_checkpoint_peak()
    budget = chain.minimum()
    front = []
    while True:
        plan = _optimal(chain, budget)
        front.append(plan)
        if plan.recompute_cost == 0 or budget >= top:
            return front
        # least budget whose best plan is strictly cheaper than this one
        budget = least_budget_where(
            budget, top, lambda b: chain.cost_prefix[chain.plan_at(b)[-1]] < plan.recompute_cost)


def plan_chain(layers, x, budget_bytes, repeats: int = 3, allocator: bool = False) -> Plan:
    """Profile `layers` on `x` and return the cheapest plan whose step peak fits `budget_bytes`.

    The step is `checkpoint_sequential(layers, x, boundaries=plan.boundaries)` followed by
    `.float().sum().backward()`, with parameter gradients allocated beforehand; `peak_bytes` is
    its predicted peak (x and parameters are allocated before the step, so they are not in
    it). Recompute cost is in profiled forward seconds. Raises BudgetTooSmallError naming the
    least budget any plan fits. No checkpointed segment starts at a layer that writes its
    input in place (`checkpoint_sequential` refuses that).

    What a budget counts, in one of two units:

    * ``allocator=False`` (the default), tensor bytes: every storage an operation of the step
      creates (a view's once), alive at the same moment; `peak_bytes` predicts the
      `peak_bytes` of `track_memory()` around the step.
    * ``allocator=True``, the allocator's bytes: `peak_bytes` predicts the
      `allocator_peak_bytes` of `track_memory(allocator=True)` around the step, the most the
      allocator itself held (every device together), so the allocator's own peak stays within
      the budget. On top of the tensor bytes that counts operations' temporaries, allocated
      and freed inside one operation (a CPU convolution's column buffers), and what no
      operation makes: the random generators' states every live checkpoint keeps
      (``preserve_rng_state=True``, the default: the CPU generator's, 5,056 bytes here, and
      each CUDA device's, all in CPU memory), a copy of them while a checkpoint recomputes
      (``fork_rng``), and Python numbers wrapped into tensors that autograd saves
      (``att * 0.125``: 8 bytes, kept until that backward, checkpoint or not). Exact on CPU
      (tests/plan/test_plan_allocator.py); the profile runs under ``torch.profiler``, so not inside
      another profiler.

    On CUDA ``allocator=True`` is untested: the caching allocator rounds each block up (to
    512 bytes); the profile's peaks and saved bytes are read from the allocator and include
    it, but the tensors that pass between layers (outputs, kept inputs, gradients) are counted
    at their own size, so a prediction can fall short by their rounding; and the cached blocks
    it holds besides (`torch.cuda.memory_reserved`) are no unit here.
    """
    from .profile import profile_layers
    return optimal_segments(profile_layers(layers, x, repeats=repeats, allocator=allocator),
                            budget_bytes)


# ------------------------------------------------------------------------ the step model
class _StepChain(_Searches):
    """The step model of a profile (`step_model.StepModel`) with each layer's recompute cost:
    what the searches above ask of a chain, answered from the model's tables."""

    def __init__(self, profile, cost=None):
        profile = list(profile)
        if cost is not None:
            cost = list(cost)
            if profile and len(cost) != len(profile):
                raise ValueError(f"fwd_cost must have one entry per layer of the profile; got "
                                 f"{len(cost)} for {len(profile)} layers")
        self.model = StepModel(profile)
        self.n = self.model.n
        self.cost = (_numbers("forward_seconds", [p.forward_seconds for p in profile])
                     if cost is None else _numbers("fwd_cost", cost))
        self.cost_prefix = list(itertools.accumulate(self.cost, initial=0))
        self._tables = None

    def tables(self):
        """The model's tables, computed once, with rows per segment end for the programme."""
        if self._tables is None:
            t = self.model.tables()
            self._tables = (np.ascontiguousarray(t.segment.T), np.ascontiguousarray(t.kept.T),
                            t.last)
        return self._tables

    def plan_at(self, budget: int):
        """The least-cost plan whose step peak is within `budget` (None if none fits): for each
        segment end k the least kept bytes over every start i whose segment fits after what
        the segments before it keep (a segment's peak need not grow with its end, so every
        start is tried, a row of the tables at a time)."""
        segment_by_end, kept_by_end, last = self.tables()
        n = self.n
        best = np.full(n, np.inf)
        parent = [None] * n
        best[0] = 0.0
        for k in range(1, n):
            fits = best[:k] + segment_by_end[k, :k] <= budget
            cand = np.where(fits, best[:k] + kept_by_end[k, :k], np.inf)
            i = int(cand.argmin())
            if cand[i] < np.inf:
                best[k] = cand[i]
                parent[k] = i
        fits = np.nonzero(best + last <= budget)[0]
        if len(fits) == 0:
            return None
        t = min(fits.tolist(), key=lambda t: (self.cost_prefix[t], t))
        starts = [t]
        while starts[-1] > 0:
            starts.append(parent[starts[-1]])
        return starts[::-1]

    def evaluate(self, starts) -> Plan:
        """Step peak and recompute cost of given segment starts."""
        return Plan(list(starts), self.model.peak(starts), self.cost_prefix[starts[-1]])

    def no_checkpoint_peak(self) -> int:
        """Step peak without any checkpoint."""
        return self.model.last_segment_peak(0)

    def lower_bound(self) -> int:
        """A budget no plan fits: every plan has a last segment, and a segment starting at 0."""
        segment_by_end, _, last = self.tables()
        first = min(float(segment_by_end[:, 0].min()), float(last[0]))
        return int(max(float(last.min()), first)) - 1
