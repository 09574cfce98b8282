"""Where to put checkpoints: the cheapest segmentation of a chain that fits a memory budget.

A plan is a list of segment starts beginning with 0, applied by
`checkpoint_sequential(layers, x, boundaries=plan.boundaries)`. Every segment but the last is
checkpointed: it keeps only its input and runs its forward once more in backward. Memory is
modelled as in `formulas.segmented_peak_bytes`: max over segments j of (kept inputs of the
segments before j + everything segment j saves).

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
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass

from .checkpoint import segment_starts
from .formulas import segmented_peak_bytes


class BudgetTooSmallError(ValueError):
    """No segmentation of the chain fits the budget."""

    def __init__(self, budget_bytes: int, minimum_bytes: int):
        self.budget_bytes, self.minimum_bytes = budget_bytes, minimum_bytes
        super().__init__(
            f"budget of {budget_bytes:,} bytes is below the least peak any plan reaches, "
            f"{minimum_bytes:,} bytes; raise the budget, use a smaller batch, or split layers "
            "into smaller pieces.")


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


class _Chain:
    """Validated sizes with prefix sums, shared by every function here."""

    def __init__(self, act_bytes, out_bytes, fwd_cost, input_bytes):
        self.act = _ints("act_bytes", act_bytes)
        self.out = _ints("out_bytes", out_bytes)
        self.cost = _numbers("fwd_cost", fwd_cost)
        n = len(self.act)
        if n == 0:
            raise ValueError("the chain is empty; give one entry per layer")
        if len(self.out) != n or len(self.cost) != n:
            raise ValueError(f"act_bytes, out_bytes and fwd_cost must have one entry per "
                             f"layer; got lengths {n}, {len(self.out)}, {len(self.cost)}")
        self.input = _ints("input_bytes", [input_bytes])[0]
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

    def minimum(self) -> int:
        """The least budget any plan fits, by bisection on integer bytes."""
        lo, hi = max(self.act) - 1, self.no_checkpoint_peak()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.plan_at(mid) is None:
                lo = mid
            else:
                hi = mid
        return hi

    def least_budget_for(self, cost, lo: int, hi: int) -> int:
        """Least budget in (lo, hi] whose best plan costs <= cost (hi must qualify)."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            plan = self.plan_at(mid)
            if plan is None or self.cost_prefix[plan[-1]] > cost:
                lo = mid
            else:
                hi = mid
        return hi


def _ints(name: str, values) -> list:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 \
                or int(v) != v:
            raise ValueError(f"{name}[{i}] must be a whole number of bytes >= 0, got {v!r}")
        out.append(int(v))
    return out


def _numbers(name: str, values) -> list:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 \
                or v == float("inf"):
            raise ValueError(f"{name}[{i}] must be a finite number >= 0, got {v!r}")
        out.append(v)
    return out


def _budget(budget_bytes) -> int:
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) \
            or budget_bytes != budget_bytes or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be a number of bytes >= 0, got {budget_bytes!r}")
    return int(budget_bytes) if budget_bytes != float("inf") else None


def optimal_segments(act_bytes, out_bytes, fwd_cost, budget_bytes, input_bytes=0) -> Plan:
    """The plan of least recompute cost whose peak fits `budget_bytes` (least peak on ties).

    Raises BudgetTooSmallError (a ValueError) naming the feasible minimum when nothing fits.
    """
    chain = _Chain(act_bytes, out_bytes, fwd_cost, input_bytes)
    budget = _budget(budget_bytes)
    top = chain.no_checkpoint_peak()  # no checkpoint at all fits this, so more buys nothing
    budget = top if budget is None else min(budget, top)
    starts = chain.plan_at(budget)
    if starts is None:
        raise BudgetTooSmallError(budget, chain.minimum())
    cost = chain.cost_prefix[starts[-1]]
    lo = max(chain.act) - 1
    tight = chain.least_budget_for(cost, lo, budget)
    return chain.evaluate(chain.plan_at(tight))


def minimum_peak(act_bytes, out_bytes, fwd_cost=None, input_bytes=0) -> int:
    """The least peak bytes any segmentation of the chain reaches (recompute cost ignored)."""
    fwd_cost = [0] * len(list(act_bytes)) if fwd_cost is None else fwd_cost
    return _Chain(act_bytes, out_bytes, fwd_cost, input_bytes).minimum()


def evaluate_plan(boundaries, act_bytes, out_bytes, fwd_cost, input_bytes=0) -> Plan:
    """Peak bytes and recompute cost of the given segment starts (a list beginning with 0)."""
    chain = _Chain(act_bytes, out_bytes, fwd_cost, input_bytes)
    starts = list(boundaries)
    if not starts or starts[0] != 0:
        raise ValueError(f"boundaries must begin with 0, got {starts}")
    starts = segment_starts(chain.n, boundaries=starts)
    return chain.evaluate(starts)


def uniform_plan(n: int, segments: int) -> list:
    """Segment starts of checkpoint_sequential(segments=...): size n // segments, last gets the rest."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (number of layers), got {n!r}")
    return segment_starts(n, segments=segments)


def pareto_front(act_bytes, out_bytes, fwd_cost, input_bytes=0) -> list:
    """Every budget at which the least recompute cost drops: plans from tightest to none.

    Each entry is the least-peak plan of its cost; peaks rise and costs fall along the list.
    """
    chain = _Chain(act_bytes, out_bytes, fwd_cost, input_bytes)
    top = chain.no_checkpoint_peak()
    budget = chain.minimum()
    front = []
    while True:
        plan = optimal_segments(chain.act, chain.out, chain.cost, budget, chain.input)
        front.append(plan)
        if plan.recompute_cost == 0 or budget >= top:
            return front
        # least budget whose best plan is strictly cheaper than this one
        lo, hi = budget, top
        while hi - lo > 1:
            mid = (lo + hi) // 2
            starts = chain.plan_at(mid)
            if chain.cost_prefix[starts[-1]] < plan.recompute_cost:
                hi = mid
            else:
                lo = mid
        budget = hi


def plan_peak_bounds(boundaries, act_bytes, out_bytes, work_bytes, input_bytes: int = 0):
    """(low, high) bytes that the measured step peak of a plan must lie between.

    low is the planner's model (`formulas.segmented_peak_bytes`): while a segment's
    activations are alive, so are the inputs kept before it. high adds what the model leaves
    out, segment by segment: the segment's own input (`profile_layers` books it to the layer
    before, which saved it first) and the largest backward working memory of its layers
    (`backward_work_bytes`), counted as if it coincided with all the segment's activations.
    """
    n = len(act_bytes)
    if not (len(out_bytes) == len(work_bytes) == n):
        raise ValueError(f"act_bytes, out_bytes and work_bytes need one entry per layer; got "
                         f"lengths {n}, {len(out_bytes)}, {len(work_bytes)}")
    starts = list(boundaries)
    low = segmented_peak_bytes(starts, act_bytes, out_bytes, input_bytes)
    kept, high = 0, 0
    for a, b in zip(starts, starts[1:] + [n]):
        own = input_bytes if a == 0 else out_bytes[a - 1]
        high = max(high, kept + own + sum(act_bytes[a:b]) + max(work_bytes[a:b]))
        kept += own
    return low, high
