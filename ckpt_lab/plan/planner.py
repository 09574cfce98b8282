"""Where to put checkpoints: the cheapest segmentation of a chain that fits a memory budget.

A plan is a list of segment starts beginning with 0, applied by
`checkpoint_sequential(layers, x, boundaries=plan.boundaries)`. Every segment but the last is
checkpointed: it keeps only its input and runs its forward once more in backward. Two
memory models, chosen by what a function is given:

* a profile from `profile_layers(layers, x)`: the step model (`step_peak_bytes`), the peak
  `track_memory` measures for one training step with the plan, built from measurements of
  each layer alone; `plan_chain(layers, x, budget_bytes)` profiles and plans in one call.
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
  seg[i, k] is tabulated once with numpy, and each position takes the minimum over all i,
  O(n^2) per budget in vectorised steps (1,000 layers plan in well under a second).
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from ..checkpoint import segment_starts
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


def least_budget_where(lo: int, hi: int, holds) -> int:
    """The least integer budget in (lo, hi] where ``holds(budget)`` is true, by bisection; it
    must hold at ``hi`` and keep holding as the budget grows (what fits a budget fits more)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


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

    def lower_bound(self) -> int:
        """A budget no plan fits (bisections start above it)."""
        return max(self.act) - 1


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
        return _Step(act_bytes, fwd_cost)
    if out_bytes is None or fwd_cost is None:
        raise ValueError("give either a profile (a list of LayerProfile from profile_layers) or "
                         "act_bytes, out_bytes and fwd_cost")
    return _Chain(act_bytes, out_bytes, fwd_cost, input_bytes)


def _optimal(chain, budget_bytes) -> Plan:
    budget = _budget(budget_bytes)
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
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (number of layers), got {n!r}")
    return segment_starts(n, segments=segments)


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


# ------------------------------------------------------------------------- the exact step model
HEAD_BYTES = 8  # `.float().sum()` and the gradient of that sum: two fp32 scalars

_STEP_FIELDS = ("own_bytes", "saves_input", "saves_output", "saves_any", "forward_peak_bytes",
                "free_forward_peak_bytes", "backward_peak_bytes", "held_backward_peak_bytes",
                "grad_in_bytes", "recompute_own_bytes", "recompute_forward_peak_bytes",
                "recompute_peak_bytes", "recompute_backward_peak_bytes",
                "recompute_held_backward_peak_bytes")


class _Step(_Searches):
    """A profile's per-layer pieces, and the step peak they add up to for given segments."""

    def __init__(self, profile, cost=None):
        profile, cost = list(profile), None if cost is None else list(cost)
        if not profile:
            raise ValueError("the profile is empty; give one LayerProfile per layer")
        if cost is not None and len(cost) != len(profile):
            raise ValueError(f"fwd_cost must have one entry per layer of the profile; got "
                             f"{len(cost)} for {len(profile)} layers")
        for i, p in enumerate(profile):
            missing = [f for f in _STEP_FIELDS if getattr(p, f, None) is None]
            if missing:
                raise ValueError(f"profile[{i}] lacks {', '.join(missing)}: the step model needs "
                                 "a profile measured by profile_layers(layers, x)")
        self.n = n = len(profile)
        self.cost = (_numbers("forward_seconds", [p.forward_seconds for p in profile])
                     if cost is None else _numbers("fwd_cost", cost))
        self.cost_prefix = list(itertools.accumulate(self.cost, initial=0))
        get = lambda f: [getattr(p, f) for p in profile]  # noqa: E731
        self.out = _ints("out_bytes", get("out_bytes"))
        self.own = _ints("own_bytes", get("own_bytes"))
        self.fwd = _ints("forward_peak_bytes", get("forward_peak_bytes"))
        self.free = _ints("free_forward_peak_bytes", get("free_forward_peak_bytes"))
        # a checkpointed segment's layers run forward again in backward, maybe saving more
        self.own_r = _ints("recompute_own_bytes", get("recompute_own_bytes"))
        self.fwd_r = _ints("recompute_forward_peak_bytes", get("recompute_forward_peak_bytes"))
        self.rec = _ints("recompute_peak_bytes", get("recompute_peak_bytes"))
        self.bwd_r = _ints("recompute_backward_peak_bytes", get("recompute_backward_peak_bytes"))
        self.held_r = _ints("recompute_held_backward_peak_bytes",
                            get("recompute_held_backward_peak_bytes"))
        self.bwd = _ints("backward_peak_bytes", get("backward_peak_bytes"))
        self.held = _ints("held_backward_peak_bytes", get("held_backward_peak_bytes"))
        self.gin = _ints("grad_in_bytes", get("grad_in_bytes"))
        self.saves_in = [bool(v) for v in get("saves_input")]
        self.saves_out = [bool(v) for v in get("saves_output")]
        self.saves = [bool(v) for v in get("saves_any")]
        # allocator unit: a checkpoint of a segment starting at a holds its generator states
        # from its forward for as long as it keeps its input, and a copy of the current ones
        # while it recomputes (fork_rng); 0 in tensor bytes, and in a hand-made profile
        self.state = _ints("checkpoint_state_bytes",
                           [getattr(p, "checkpoint_state_bytes", 0) or 0 for p in profile])
        # allocator unit: what autograd keeps for a layer's backward past the saved-tensor
        # hooks (a wrapped Python number), held under a checkpoint too until that backward
        self.unhooked = _ints("unhooked_bytes",
                              [getattr(p, "unhooked_bytes", 0) or 0 for p in profile])
        self.unhooked_prefix = list(itertools.accumulate(self.unhooked, initial=0))
        # the checkpoint's replay of module state (module_state), per layer: copies of its
        # persistent buffers alive through a checkpointed forward (all of the segment's, from
        # its entry), those of buffers the forward changed kept with the checkpoint's input,
        # fresh copies alive through the segment's recompute, and the part of those the
        # recompute saves, held until the layer's backward (counted in own_r and bwd_r too)
        pieces = ("buffer_copy_bytes", "changed_buffer_bytes", "recompute_buffer_bytes",
                  "recompute_saved_buffer_bytes")
        copy, changed, rcopy, rsaved = (
            _ints(f, [getattr(p, f, 0) or 0 for p in profile]) for f in pieces)
        self.copy_prefix, self.changed_prefix, self.rcopy_prefix, self.rsaved_prefix = (
            list(itertools.accumulate(v, initial=0)) for v in (copy, changed, rcopy, rsaved))
        self.rcopy = rcopy
        units = {bool(getattr(p, "allocator", False)) for p in profile}
        if len(units) > 1:
            raise ValueError("the profile mixes units: measure every layer with the same "
                             "profile_layers(..., allocator=...)")
        # the loss and the seed gradient `backward()` makes for it (fp32 scalars) stay alive all
        # through backward; the last layer's measurements already include them
        self.head = HEAD_BYTES
        # a layer that returns a view of its input (nn.Flatten) makes no storage: root[i] is the
        # layer that made the storage of layer i's input (-1: x, allocated before the step)
        self.view = [bool(getattr(p, "output_is_view", False)) for p in profile]
        self.root = []
        for i in range(n):
            r = i - 1
            while r >= 0 and self.view[r]:
                r -= 1
            self.root.append(r)
        self.inb = [self.out[i - 1] if self.root[i] >= 0 else 0 for i in range(n)]
        # a checkpoint keeps its segment's input to run the segment again: no checkpointed
        # segment may start where a layer writes that input in place (the layer itself, or one
        # after layers that only return views of it); checkpoint_sequential refuses it
        writes = [bool(getattr(p, "writes_input", False)) for p in profile]
        self.writer = [None] * (n + 1)
        for a in reversed(range(n)):
            self.writer[a] = a if writes[a] else self.writer[a + 1] if self.view[a] else None
        # whether layer i's input is saved by a layer before it (its maker, or a layer between
        # that saved a view of it): then it is counted there, not as layer i's
        self.prev_saved = [self.root[i] >= 0 and self._saved_before(0, i) for i in range(n)]
        self.ex = [self._ex(0, k) for k in range(n)]

    def _saved_before(self, a: int, i: int) -> bool:
        r = self.root[i]
        if r < 0 or r < a:
            return r < a and i > a   # the segment's own input: kept by its checkpoint
        return self.saves_out[r] or any(self.saves_in[j] and self.root[j] == r
                                        for j in range(max(r + 1, a), i))

    def _ex(self, a: int, k: int) -> int:
        """Layer k's input, kept alive after its forward when no earlier layer of a segment
        starting at a counts it (only for k > a: a segment's own input is counted apart)."""
        if k <= a or not self.saves_in[k] or self._covered(a, k):
            return 0
        return self.inb[k]

    def _covered(self, a: int, i: int) -> bool:
        """In a segment starting at a, is layer i's input counted already (i > a)?"""
        return self._saved_before(a, i) if self.root[i] >= a else True

    def kept(self, a: int, b: int) -> int:
        """Bytes checkpointed segment [a, b) keeps until its backward: what its checkpoint
        holds, and (allocator unit) what its layers' graph holds past the hooks."""
        return self._checkpoint(a, b) + self._unhooked(a, b)

    def _checkpoint(self, a: int, b: int) -> int:
        """What the checkpoint of segment [a, b) holds: its input (x is not counted), the
        copies of the buffers its forward changed and, in the allocator's unit, its generator
        states, unless none of its layers saves anything, when the checkpoint has nothing to
        recompute and lets go."""
        if not any(self.saves[a:b]):
            return 0
        return self.inb[a] + self.state[a] + self._span(self.changed_prefix, a, b)

    @staticmethod
    def _span(prefix, a: int, b: int) -> int:
        """Sum of a per-layer piece over layers a..b-1, from its prefix sums."""
        return prefix[b] - prefix[a]

    def _unhooked(self, a: int, i: int) -> int:
        """What the forward's graph keeps for layers a..i-1 past the saved-tensor hooks."""
        return self.unhooked_prefix[i] - self.unhooked_prefix[a]

    def _input_alive(self, a: int, i: int) -> int:
        """Layer i's input while its forward runs, unless already counted (i > a)."""
        return 0 if self._covered(a, i) else self.inb[i]

    def _backward(self, a: int, i: int, again: bool = False) -> int:
        """Layer i's backward peak in a segment starting at a: is its input held elsewhere?
        `again`: after a recompute."""
        bwd, held = (self.bwd_r, self.held_r) if again else (self.bwd, self.held)
        return bwd[i] if i == a or self._covered(a, i) else held[i]

    def segment_peak(self, a: int, b: int) -> int:
        """Peak of checkpointed segment [a, b), its kept input included, earlier ones not."""
        # alive while the segment's forward runs: its input, generator states, and the copies
        # of every persistent buffer of its layers the checkpoint makes at the forward's entry
        x = self.inb[a] + self.state[a] + self._span(self.copy_prefix, a, b)
        terms = [x + self._unhooked(a, i) + (self.inb[i] if i > a and self.root[i] >= a else 0)
                 + self.free[i] for i in range(a, b)]
        saving = [i for i in range(a, b) if self.saves[i]]
        last = saving[-1] if saving else a - 1
        # layers after the last that saves anything run backward before any recompute
        x_back = self._checkpoint(a, b) + self.head
        terms += [x_back + self._unhooked(a, i) + self._backward(a, i, True)
                  for i in range(last + 1, b)]
        if saving:
            # the recompute stops right after the last save; the incoming gradient is alive,
            # (allocator unit) a copy of the generator states the recompute puts back, and the
            # buffer copies it swaps in for every layer of the segment: layer i's are in its
            # own peak, the saved ones of the layers before it in `kept`
            kept = 0
            copies = self._span(self.rcopy_prefix, a, b)
            for i in range(a, last + 1):
                peak = self.rec[i] if i == last else self.fwd_r[i]
                others = copies - self.rcopy[i] - self._span(self.rsaved_prefix, a, i)
                terms.append(x_back + self._unhooked(a, last + 1) + self.state[a]
                             + self.gin[last] + kept + others
                             + (self._input_alive(a, i) if i > a else 0) + peak)
                kept += self.own_r[i] + self._ex(a, i)
            for i in range(last, a - 1, -1):
                kept -= self.own_r[i] + self._ex(a, i)
                terms.append(x_back + kept + self._backward(a, i, True))
        return max(terms)

    def last_peak(self, t: int) -> int:
        """Peak of the last segment [t, n), run without checkpoint, earlier kept inputs not counted.

        Its input is held by `checkpoint_sequential` all through its forward and afterwards only
        if layer t saves it; the head `.float().sum()` is part of the last layer's measurements.
        """
        x = self.inb[t]
        terms, kept = [], 0
        for i in range(t, self.n):
            terms.append(x + kept + (self._input_alive(t, i) if i > t else 0) + self.fwd[i])
            kept += self.own[i] + self._ex(t, i)
        # the input stays after the forward if a layer saves it (or a view of it): until the
        # first of those runs backward, whose measurement holds it
        savers = [j for j in range(t, self.n) if self.saves_in[j] and (j == t or self.root[j] < t)]
        first = savers[0] if savers else self.n
        for i in range(self.n - 1, t - 1, -1):
            kept -= self.own[i] + self._ex(t, i)
            head = self.head if i < self.n - 1 else 0
            if i == t:
                terms.append(head + (self.held[t] if t > 0 else self.bwd[0]))
            elif i == first:
                terms.append(head + kept + self.held[i])
            else:
                terms.append(head + kept + (x if i > first else 0) + self._backward(t, i))
        return max(terms)

    # The planner's view: the same pieces for every segment at once (numpy, checked against
    # segment_peak and last_peak by the tests). seg[a, b] = segment_peak(a, b), last[t] =
    # last_peak(t); a plan's peak is then max over its segments of (kept before + seg), and
    # the last segment's (kept before + last), exactly as for the activation model.
    def _tables(self):
        if hasattr(self, "seg"):
            return
        n, i64 = self.n, np.int64
        own, ex, out = (np.array(v, dtype=i64) for v in (self.own, self.ex, self.out))
        fwd, free, rec = (np.array(v, dtype=i64) for v in (self.fwd, self.free, self.rec))
        bwd, held, gin = (np.array(v, dtype=i64) for v in (self.bwd, self.held, self.gin))
        own_r, fwd_r, bwd_r, held_r = (np.array(v, dtype=i64) for v in
                                       (self.own_r, self.fwd_r, self.bwd_r, self.held_r))
        saves = np.array(self.saves)
        state = np.array(self.state, dtype=i64)
        uh = np.array(self.unhooked_prefix, dtype=i64)
        cp, chp, rcp, rsp = (np.array(v, dtype=i64) for v in (
            self.copy_prefix, self.changed_prefix, self.rcopy_prefix, self.rsaved_prefix))
        rcopy = np.array(self.rcopy, dtype=i64)
        never = np.iinfo(i64).min // 4                                 # below any real term
        saves_in = np.array(self.saves_in, dtype=bool)
        root = np.array(self.root)
        prev = np.array(self.inb, dtype=i64)                          # layer i's input
        prev_saved = np.array(self.prev_saved, dtype=bool)
        q = np.concatenate([[0], np.cumsum(own + ex)])
        alive = np.where(prev_saved, 0, prev)                         # input alive in forward
        bwdv = np.where(prev_saved, bwd, held)
        q_r = np.concatenate([[0], np.cumsum(own_r + ex)])
        bwdv_r = np.where(prev_saved, bwd_r, held_r)
        seg = np.full((n, n), np.inf)
        keep = np.zeros((n, n))
        for a in range(n - 1):
            ks = np.arange(a, n - 1)
            if self.view[a]:
                # the start is a view: layers viewing the same storage have it counted already
                cov = (root[ks] < a) | prev_saved[ks]
                ex_a = np.where(saves_in[ks] & ~cov, prev[ks], 0)
                ex_a[0] = 0
                s_ = np.concatenate([[0], np.cumsum(own_r[ks] + ex_a)[:-1]])
                f = np.where(root[ks] >= a, prev[ks], 0) + free[ks]
                bv = np.where(cov, bwd_r[ks], held_r[ks])
                rin = np.where(cov, 0, prev[ks])
            else:
                s_ = q_r[ks] - q_r[a] - ex[a]
                f = prev[ks] + free[ks]
                bv = bwdv_r[ks].copy()
                rin = alive[ks].copy()
            s_[0] = 0
            f[0] = free[a]
            bv[0] = bwd_r[a]
            rin[0] = 0
            past = uh[ks] - uh[a]              # kept past the hooks for layers a..k-1
            f = f + past
            sv = saves[ks]
            rel = np.arange(len(ks))
            last = np.maximum.accumulate(np.where(sv, rel, -1))
            has = last >= 0
            at = np.maximum(last, 0)
            covered = np.where(has, np.maximum.accumulate(s_ + bv)[at], 0)
            group = np.cumsum(sv)
            bt = bv + past
            big = int(bt.max()) + 2
            tail = np.maximum.accumulate(group * big + np.where(sv, -1, bt)) - group * big
            # the recompute's buffer copies: those of the whole segment [a, k + 1) are alive
            # (added below), less layer i's (in its own peak) and the saved ones of layers
            # a..i-1 (in s_)
            mine = rcopy[ks] + rsp[ks] - rsp[a]
            vf = s_ + rin + fwd_r[ks] - mine
            before = np.concatenate([[never], np.maximum.accumulate(vf)[:-1]])
            r_at = state[a] + uh[ks + 1] - uh[a] + gin[ks] \
                + np.maximum(before, s_ + rin + rec[ks] - mine)
            r = np.where(has, r_at[at] + rcp[ks + 1] - rcp[a], 0)
            back = np.maximum(np.maximum(covered, tail), r) + self.head
            ckpt = prev[a] + state[a] + chp[ks + 1] - chp[a]   # what the checkpoint keeps
            seg[a, a + 1:] = np.maximum(prev[a] + state[a] + cp[ks + 1] - cp[a]
                                        + np.maximum.accumulate(f),
                                        np.where(has, ckpt, 0) + back) \
                if self.writer[a] is None else np.inf
            # a segment none of whose layers saves anything keeps no input (nor states)
            keep[a, a + 1:] = np.where(has, ckpt, 0) + uh[ks + 1] - uh[a]
        ts = np.arange(n)
        a_f = q[ts] + alive + fwd
        head = np.where(ts < n - 1, self.head, 0)
        a_b = q[ts] + bwdv + head
        suffix = lambda v: np.concatenate([np.maximum.accumulate(v[::-1])[::-1][1:], [-np.inf]])  # noqa: E731
        fl = prev + np.maximum(fwd, suffix(a_f) - q[:-1] - ex)
        xs = np.where(np.array(self.saves_in), prev, 0)
        first = np.where(ts > 0, held, bwd) + head
        bl = np.maximum(first, own + xs - q[1:] + suffix(a_b))
        self.seg_t = np.ascontiguousarray(seg.T)       # row b: every start a of a segment [a, b)
        self.seg = seg
        self.last = np.maximum(fl, bl)
        for t in np.nonzero(np.array(self.view))[0]:
            self.last[t] = self.last_peak(int(t))
        self.keep_t = np.ascontiguousarray(keep.T)     # row b: what [a, b) keeps, every a

    def plan_at(self, budget: int):
        """The least-cost plan whose step peak is within `budget` (None if none fits)."""
        self._tables()
        n = self.n
        best = np.full(n, np.inf)
        parent = [None] * n
        best[0] = 0.0
        seg_t, keep_t, inf = self.seg_t, self.keep_t, np.inf
        for k in range(1, n):
            cand = np.where(best[:k] + seg_t[k, :k] <= budget, best[:k] + keep_t[k, :k], inf)
            i = int(cand.argmin())
            if cand[i] < inf:
                best[k] = cand[i]
                parent[k] = i
        fits = np.nonzero(best + self.last <= budget)[0]
        if len(fits) == 0:
            return None
        t = min(fits.tolist(), key=lambda t: (self.cost_prefix[t], t))
        starts = [t]
        while starts[-1] > 0:
            starts.append(parent[starts[-1]])
        return starts[::-1]

    def evaluate(self, starts) -> Plan:
        """Step peak and recompute cost of given segment starts."""
        return Plan(list(starts), self.peak(starts), self.cost_prefix[starts[-1]])

    def no_checkpoint_peak(self) -> int:
        """Step peak without any checkpoint."""
        return self.last_peak(0)

    def lower_bound(self) -> int:
        """A budget no plan fits: every plan has a last segment, and a segment starting at 0."""
        self._tables()
        first = min(float(self.seg[0].min()), float(self.last[0]))
        return int(max(float(self.last.min()), first)) - 1

    def peak(self, starts) -> int:
        """Step peak of segments starting at `starts` (validated, beginning with 0)."""
        for a in starts[:-1]:
            if self.writer[a] is not None:
                raise ValueError(
                    f"no checkpointed segment can start at layer {a}: layer {self.writer[a]} "
                    "writes its input in place, which the checkpoint keeps to run the segment "
                    "again (checkpoint_sequential refuses it); " + (
                        f"move that boundary to {self.writer[a] + 1}." if a > 0 else
                        "only boundaries=[0] (no checkpoint) runs this chain."))
        kept, peak = 0, 0
        for a, b in zip(starts, starts[1:]):
            peak = max(peak, kept + self.segment_peak(a, b))
            kept += self.kept(a, b)
        return max(peak, kept + self.last_peak(starts[-1]))


def step_peak_bytes(boundaries, profile) -> int:
    """Predicted peak bytes of one step: `checkpoint_sequential(layers, x, boundaries=...)`
    followed by `.float().sum().backward()`, parameter gradients allocated beforehand.

    `profile` comes from `profile_layers(layers, x)`. Counted are the storages the step
    allocates (x and the parameters are allocated before it), as `track_memory` counts them;
    from `profile_layers(layers, x, allocator=True)`, the allocator's bytes instead (its
    `allocator_peak_bytes`, see `plan_chain`).
    Every piece is a measurement of one layer alone; what this function adds is which pieces
    are alive together: while segment j is recomputed and run backward, the inputs (and
    buffer copies) kept by segments 0..j, the gradient arriving at segment j, the activations
    its layers saved and not yet used, and the working memory of the layer running.

    A layer that returns its input's storage (`nn.Flatten` of a contiguous input,
    ``nn.ReLU(inplace=True)``) makes none; its output is counted with the tensor it shares. A
    checkpointed segment none of whose layers saves anything keeps nothing. One case stays
    inexact: a segment of layers that return views, one of which saves something, keeps the
    same tensor as the segment before, counted twice (high, never low). A plan with a
    checkpointed segment starting where a layer writes its input in place raises ValueError:
    the step refuses it (`checkpoint_sequential`).

    Counted too, in both units, are the copies of module buffers a checkpoint makes to replay
    module state (``ckpt_lab.checkpoint.module_state``), each measured per layer by `profile_layers`: the
    copies of every persistent buffer of a checkpointed segment's layers, alive through that
    segment's forward (`buffer_copy_bytes`); those of the buffers its forward changed (batch
    norm's counter), kept with the checkpoint's input until its backward
    (`changed_buffer_bytes`); and the fresh copies of the changed and the saved buffers made
    when its recompute starts (`recompute_buffer_bytes`: batch norm's counter and statistics),
    alive until the recompute ends, or until the layer's backward for those the recompute
    saves (`recompute_saved_buffer_bytes`: ``nn.BatchNorm2d``'s statistics; none for
    `models.RecomputeSafeBatchNorm2d`, which saves copies of its own). Exact on CPU in both
    units for chains with batch norms and for a module of one's own whose forward changes some
    buffers and saves others (tests/plan/test_plan_step.py, tests/plan/test_plan_allocator.py).
    """
    step = _Step(profile)
    return step.peak(segment_starts(step.n, boundaries=list(boundaries)))
