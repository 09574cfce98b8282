"""The memory of one training step of a checkpointed chain, from a profile of its layers.

The step is ``checkpoint_sequential(layers, x, boundaries=starts)`` followed by
``.float().sum().backward()``, with parameter gradients allocated beforehand. Every piece of
its live bytes belongs to one layer and `profile_layers` measures it with that layer alone
(what it saves, its forward and backward peaks, the gradient arriving at it, the copies of
module buffers a checkpoint makes, ...). What this file adds is which pieces are alive
together. A plan's peak is

    max( max over checkpointed segments j of  kept(segments before j) + segment_peak(j),
         kept(every checkpointed segment) + last_segment_peak )

where `kept` is what a checkpointed segment holds until its backward (its input, the copies of
the buffers its forward changed, in the allocator's unit its generator states),
`segment_peak` the most a checkpointed segment holds while it runs forward, recomputes and
runs backward, and `last_segment_peak` the same for the last segment, run without checkpoint.

`StepModel` writes the three out for one segment at a time, to be read. The planner asks for
every segment of a long chain at once, so `StepModel.tables` computes the same numbers with
numpy, one start at a time: the readable form alone plans a chain of 1,000 layers in minutes,
the tables in well under a second (``benchmarks/bench_planner.py`` times both). Tests hold the
two equal on random profiles, and both to measured steps.
"""
from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass

import numpy as np

from ..checkpoint import segment_starts

HEAD_BYTES = 8  # `.float().sum()` and the gradient of that sum: two fp32 scalars

REQUIRED = ("own_bytes", "saves_input", "saves_output", "saves_any", "forward_peak_bytes",
            "free_forward_peak_bytes", "backward_peak_bytes", "held_backward_peak_bytes",
            "grad_in_bytes", "recompute_own_bytes", "recompute_forward_peak_bytes",
            "recompute_peak_bytes", "recompute_backward_peak_bytes",
            "recompute_held_backward_peak_bytes")


def whole_bytes(name: str, values) -> list:
    """`values` as ints, refusing anything that is not a whole number of bytes >= 0."""
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v or v < 0 \
                or int(v) != v:
            raise ValueError(f"{name}[{i}] must be a whole number of bytes >= 0, got {v!r}")
        out.append(int(v))
    return out


def _prefix(values) -> list:
    """Prefix sums: ``p[b] - p[a]`` is the sum of ``values[a:b]``."""
    return list(itertools.accumulate(values, initial=0))


@dataclass
class SegmentTables:
    """`StepModel`'s numbers for every segment at once: ``segment[a, b]`` is
    `segment_peak(a, b)` (inf where no checkpointed segment may start at a), ``kept[a, b]``
    is `kept(a, b)`, ``last[t]`` is `last_segment_peak(t)`."""

    segment: np.ndarray
    kept: np.ndarray
    last: np.ndarray


class StepModel:
    """A profile's per-layer pieces, and the step peak they add up to for given segments."""

    def __init__(self, profile):
        profile = list(profile)
        if not profile:
            raise ValueError("the profile is empty; give one LayerProfile per layer")
        for i, p in enumerate(profile):
            missing = [f for f in REQUIRED if getattr(p, f, None) is None]
            if missing:
                raise ValueError(f"profile[{i}] lacks {', '.join(missing)}: the step model needs "
                                 "a profile measured by profile_layers(layers, x)")
        units = {bool(getattr(p, "allocator", False)) for p in profile}
        if len(units) > 1:
            raise ValueError("the profile mixes units: measure every layer with the same "
                             "profile_layers(..., allocator=...)")
        self.n = n = len(profile)

        def measured(name, default=None):
            return whole_bytes(name, [(getattr(p, name, default) or 0) if default is not None
                                      else getattr(p, name) for p in profile])

        # each layer alone, its forward saving (plain run) and its backward after it
        self.out_bytes = measured("out_bytes")
        self.saved_bytes = measured("own_bytes")                   # what it saves, made by itself
        self.forward_peak = measured("forward_peak_bytes")
        self.free_forward_peak = measured("free_forward_peak_bytes")   # forward under a checkpoint
        self.backward_peak = measured("backward_peak_bytes")           # input held elsewhere
        self.held_backward_peak = measured("held_backward_peak_bytes")  # input held by it alone
        self.grad_in = measured("grad_in_bytes")                   # the gradient arriving at it
        # the same when its forward is a checkpoint's recompute (it may save more then)
        self.recompute_saved_bytes = measured("recompute_own_bytes")
        self.recompute_forward_peak = measured("recompute_forward_peak_bytes")
        self.recompute_stop_peak = measured("recompute_peak_bytes")   # up to its last save
        self.recompute_backward_peak = measured("recompute_backward_peak_bytes")
        self.recompute_held_backward_peak = measured("recompute_held_backward_peak_bytes")
        self.saves_input = [bool(p.saves_input) for p in profile]
        self.saves_output = [bool(p.saves_output) for p in profile]
        self.saves_any = [bool(p.saves_any) for p in profile]
        # allocator unit: a checkpoint of a segment starting at a holds its generator states
        # from its forward for as long as it keeps its input, and a copy of the current ones
        # while it recomputes (fork_rng); 0 in tensor bytes, and in a hand-made profile
        self.rng_state = measured("checkpoint_state_bytes", 0)
        # allocator unit: what autograd keeps for a layer's backward past the saved-tensor
        # hooks (a wrapped Python number), held under a checkpoint too until that backward
        self.unhooked_prefix = _prefix(measured("unhooked_bytes", 0))
        # the checkpoint's replay of module state (module_state), per layer: copies of its
        # persistent buffers alive through a checkpointed forward (all of the segment's, from
        # its entry), those of buffers the forward changed kept with the checkpoint's input,
        # fresh copies alive through the segment's recompute, and the part of those the
        # recompute saves, held until the layer's backward (counted in the recompute fields too)
        self.entry_copies_prefix = _prefix(measured("buffer_copy_bytes", 0))
        self.changed_copies_prefix = _prefix(measured("changed_buffer_bytes", 0))
        self.recompute_copies = measured("recompute_buffer_bytes", 0)
        self.recompute_copies_prefix = _prefix(self.recompute_copies)
        self.recompute_saved_copies_prefix = _prefix(measured("recompute_saved_buffer_bytes", 0))
        # a layer that returns a view of its input (nn.Flatten) makes no storage: maker[i] is
        # the layer that made the storage of layer i's input (-1: x, allocated before the step)
        self.output_is_view = [bool(getattr(p, "output_is_view", False)) for p in profile]
        self.maker = []
        for i in range(n):
            r = i - 1
            while r >= 0 and self.output_is_view[r]:
                r -= 1
            self.maker.append(r)
        self.input_bytes = [self.out_bytes[i - 1] if self.maker[i] >= 0 else 0 for i in range(n)]
        # a checkpoint keeps its segment's input to run the segment again: no checkpointed
        # segment may start where a layer writes that input in place (the layer itself, or one
        # after layers that only return views of it); checkpoint_sequential refuses it
        writes = [bool(getattr(p, "writes_input", False)) for p in profile]
        self.input_writer = [None] * (n + 1)
        for a in reversed(range(n)):
            self.input_writer[a] = (a if writes[a] else self.input_writer[a + 1]
                                    if self.output_is_view[a] else None)
        # whether layer i's input is saved by a layer before it (its maker, or a layer between
        # that saved a view of it): then it is counted there, not as layer i's
        self.input_saved_before = [self.maker[i] >= 0 and self._saved_before(0, i)
                                   for i in range(n)]
        self.extra_input = [self._extra_input(0, k) for k in range(n)]

    # ----------------------------------------------------------------- whose bytes are whose
    def _saved_before(self, a: int, i: int) -> bool:
        r = self.maker[i]
        if r < 0 or r < a:
            return r < a and i > a   # the segment's own input: kept by its checkpoint
        return self.saves_output[r] or any(self.saves_input[j] and self.maker[j] == r
                                           for j in range(max(r + 1, a), i))

    def _extra_input(self, a: int, k: int) -> int:
        """Layer k's input, kept alive after its forward when no earlier layer of a segment
        starting at a counts it (only for k > a: a segment's own input is counted apart)."""
        if k <= a or not self.saves_input[k] or self._input_counted(a, k):
            return 0
        return self.input_bytes[k]

    def _input_counted(self, a: int, i: int) -> bool:
        """In a segment starting at a, is layer i's input counted already (i > a)?"""
        return self._saved_before(a, i) if self.maker[i] >= a else True

    def _input_alive(self, a: int, i: int) -> int:
        """Layer i's input while its forward runs, unless already counted (i > a)."""
        return 0 if self._input_counted(a, i) else self.input_bytes[i]

    def _backward(self, a: int, i: int, after_recompute: bool = False) -> int:
        """Layer i's backward peak in a segment starting at a: is its input held elsewhere?"""
        if after_recompute:
            elsewhere, alone = self.recompute_backward_peak, self.recompute_held_backward_peak
        else:
            elsewhere, alone = self.backward_peak, self.held_backward_peak
        return elsewhere[i] if i == a or self._input_counted(a, i) else alone[i]

    @staticmethod
    def _span(prefix, a: int, b: int) -> int:
        """Sum of a per-layer piece over layers a..b-1, from its prefix sums."""
        return prefix[b] - prefix[a]

    # ----------------------------------------------------------------- the three terms
    def checkpoint_holds(self, a: int, b: int) -> int:
        """What the checkpoint of segment [a, b) holds: its input (x is not counted), the
        copies of the buffers its forward changed and, in the allocator's unit, its generator
        states, unless none of its layers saves anything, when the checkpoint has nothing to
        recompute and lets go."""
        if not any(self.saves_any[a:b]):
            return 0
        return self.input_bytes[a] + self.rng_state[a] + self._span(self.changed_copies_prefix,
                                                                    a, b)

    def kept(self, a: int, b: int) -> int:
        """Bytes checkpointed segment [a, b) keeps until its backward: what its checkpoint
        holds, and (allocator unit) what its layers' graph holds past the hooks."""
        return self.checkpoint_holds(a, b) + self._span(self.unhooked_prefix, a, b)

    def segment_peak(self, a: int, b: int) -> int:
        """Peak of checkpointed segment [a, b), its kept input included, earlier ones not."""
        unhooked = lambda i: self._span(self.unhooked_prefix, a, i)  # noqa: E731
        # forward: its input, generator states, and the copies of every persistent buffer of
        # its layers the checkpoint makes at the forward's entry
        entry = self.input_bytes[a] + self.rng_state[a] + self._span(self.entry_copies_prefix,
                                                                     a, b)
        terms = [entry + unhooked(i)
                 + (self.input_bytes[i] if i > a and self.maker[i] >= a else 0)
                 + self.free_forward_peak[i] for i in range(a, b)]
        savers = [i for i in range(a, b) if self.saves_any[i]]
        last = savers[-1] if savers else a - 1
        # backward: layers after the last that saves anything run before any recompute
        held = self.checkpoint_holds(a, b) + HEAD_BYTES
        terms += [held + unhooked(i) + self._backward(a, i, True) for i in range(last + 1, b)]
        if savers:
            # the recompute stops right after the last save; the incoming gradient is alive,
            # (allocator unit) a copy of the generator states the recompute puts back, and the
            # buffer copies it swaps in for every layer of the segment: layer i's are in its
            # own peak, the saved ones of the layers before it in `saved`
            saved = 0
            copies = self._span(self.recompute_copies_prefix, a, b)
            for i in range(a, last + 1):
                peak = self.recompute_stop_peak[i] if i == last else self.recompute_forward_peak[i]
                others = (copies - self.recompute_copies[i]
                          - self._span(self.recompute_saved_copies_prefix, a, i))
                terms.append(held + unhooked(last + 1) + self.rng_state[a] + self.grad_in[last]
                             + saved + others + (self._input_alive(a, i) if i > a else 0) + peak)
                saved += self.recompute_saved_bytes[i] + self._extra_input(a, i)
            for i in range(last, a - 1, -1):
                saved -= self.recompute_saved_bytes[i] + self._extra_input(a, i)
                terms.append(held + saved + self._backward(a, i, True))
        return max(terms)

    def last_segment_peak(self, t: int) -> int:
        """Peak of the last segment [t, n), run without checkpoint, earlier kept inputs not
        counted.

        Its input is held by `checkpoint_sequential` all through its forward and afterwards
        only if layer t saves it; the head `.float().sum()` is part of the last layer's
        measurements.
        """
        x = self.input_bytes[t]
        terms, saved = [], 0
        for i in range(t, self.n):
            terms.append(x + saved + (self._input_alive(t, i) if i > t else 0)
                         + self.forward_peak[i])
            saved += self.saved_bytes[i] + self._extra_input(t, i)
        # the input stays after the forward if a layer saves it (or a view of it): until the
        # first of those runs backward, whose measurement holds it
        savers = [j for j in range(t, self.n)
                  if self.saves_input[j] and (j == t or self.maker[j] < t)]
        first = savers[0] if savers else self.n
        for i in range(self.n - 1, t - 1, -1):
            saved -= self.saved_bytes[i] + self._extra_input(t, i)
            head = HEAD_BYTES if i < self.n - 1 else 0
            if i == t:
                terms.append(head + (self.held_backward_peak[t] if t > 0
                                     else self.backward_peak[0]))
            elif i == first:
                terms.append(head + saved + self.held_backward_peak[i])
            else:
                terms.append(head + saved + (x if i > first else 0) + self._backward(t, i))
        return max(terms)

    def refuse_start(self, a: int) -> None:
        """Raise if no checkpointed segment may start at layer a (a layer writes its input)."""
        if self.input_writer[a] is not None:
            w = self.input_writer[a]
            raise ValueError(
                f"no checkpointed segment can start at layer {a}: layer {w} writes its input "
                "in place, which the checkpoint keeps to run the segment again "
                "(checkpoint_sequential refuses it); " + (
                    f"move that boundary to {w + 1}." if a > 0 else
                    "only boundaries=[0] (no checkpoint) runs this chain."))

    def peak(self, starts) -> int:
        """Step peak of segments starting at `starts` (validated, beginning with 0)."""
        for a in starts[:-1]:
            self.refuse_start(a)
        kept, peak = 0, 0
        for a, b in zip(starts, starts[1:]):
            peak = max(peak, kept + self.segment_peak(a, b))
            kept += self.kept(a, b)
        return max(peak, kept + self.last_segment_peak(starts[-1]))

    # ----------------------------------------------------------------- every segment at once
    def tables(self) -> SegmentTables:
        """`segment_peak`, `kept` and `last_segment_peak` for every segment, with numpy: the
        same sums as above, over all ends of segments from one start at a time."""
        n, i64 = self.n, np.int64
        arr = lambda v, dtype=i64: np.array(v, dtype=dtype)  # noqa: E731
        saved_bytes, extra = arr(self.saved_bytes), arr(self.extra_input)
        forward_peak, free_forward_peak = arr(self.forward_peak), arr(self.free_forward_peak)
        backward_peak, held_backward_peak = arr(self.backward_peak), arr(self.held_backward_peak)
        grad_in, stop_peak = arr(self.grad_in), arr(self.recompute_stop_peak)
        r_saved, r_forward = arr(self.recompute_saved_bytes), arr(self.recompute_forward_peak)
        r_backward = arr(self.recompute_backward_peak)
        r_held_backward = arr(self.recompute_held_backward_peak)
        saves_any, saves_input = arr(self.saves_any, bool), arr(self.saves_input, bool)
        rng_state, unhooked = arr(self.rng_state), arr(self.unhooked_prefix)
        entry_copies, changed_copies = arr(self.entry_copies_prefix), arr(
            self.changed_copies_prefix)
        r_copies, r_copies_prefix = arr(self.recompute_copies), arr(self.recompute_copies_prefix)
        r_saved_copies = arr(self.recompute_saved_copies_prefix)
        maker, input_bytes = np.array(self.maker), arr(self.input_bytes)
        counted = arr(self.input_saved_before, bool)      # counted at an earlier layer of 0..i
        never = np.iinfo(i64).min // 4                    # below any real term
        # from a start before the maker of each layer's input (the common case)
        input_alive = np.where(counted, 0, input_bytes)
        saved_prefix = np.concatenate([[0], np.cumsum(saved_bytes + extra)])
        r_saved_prefix = np.concatenate([[0], np.cumsum(r_saved + extra)])
        backward_term = np.where(counted, backward_peak, held_backward_peak)
        r_backward_term = np.where(counted, r_backward, r_held_backward)
        segment = np.full((n, n), np.inf)
        kept = np.zeros((n, n))
        for a in range(n - 1):
            ks = np.arange(a, n - 1)          # segment [a, k + 1) for every k
            if self.output_is_view[a]:
                # the start is a view: layers viewing the same storage have it counted already
                cov = (maker[ks] < a) | counted[ks]
                extra_a = np.where(saves_input[ks] & ~cov, input_bytes[ks], 0)
                extra_a[0] = 0
                saved_before = np.concatenate([[0], np.cumsum(r_saved[ks] + extra_a)[:-1]])
                forward = np.where(maker[ks] >= a, input_bytes[ks], 0) + free_forward_peak[ks]
                back = np.where(cov, r_backward[ks], r_held_backward[ks])
                alive = np.where(cov, 0, input_bytes[ks])
            else:
                saved_before = r_saved_prefix[ks] - r_saved_prefix[a] - extra[a]
                forward = input_bytes[ks] + free_forward_peak[ks]
                back = r_backward_term[ks].copy()
                alive = input_alive[ks].copy()
            # layer a is the segment's first: its input is the checkpoint's
            saved_before[0], forward[0], back[0], alive[0] = 0, free_forward_peak[a], \
                r_backward[a], 0
            unhooked_before = unhooked[ks] - unhooked[a]        # layers a..k-1, past the hooks
            forward = forward + unhooked_before
            saves = saves_any[ks]
            position = np.arange(len(ks))
            last_saver = np.maximum.accumulate(np.where(saves, position, -1))   # <= k
            has_saver = last_saver >= 0
            last_or_0 = np.maximum(last_saver, 0)
            # backward of the savers, after the recompute: max over a..last
            savers_backward = np.where(has_saver,
                                       np.maximum.accumulate(saved_before + back)[last_or_0], 0)
            # backward of the layers after the last saver, before any recompute: a running max
            # restarted at every saver (each saver lifts the group number)
            group = np.cumsum(saves)
            after_term = back + unhooked_before
            big = int(after_term.max()) + 2
            after_savers = np.maximum.accumulate(group * big + np.where(saves, -1, after_term)) \
                - group * big
            # the recompute of layers a..last: the buffer copies of the whole segment are alive
            # (added below), less layer i's (in its own peak) and the saved ones of layers
            # a..i-1 (in saved_before)
            own_copies = r_copies[ks] + r_saved_copies[ks] - r_saved_copies[a]
            r_forward_term = saved_before + alive + r_forward[ks] - own_copies
            before = np.concatenate([[never], np.maximum.accumulate(r_forward_term)[:-1]])
            recompute_at = rng_state[a] + unhooked[ks + 1] - unhooked[a] + grad_in[ks] \
                + np.maximum(before, saved_before + alive + stop_peak[ks] - own_copies)
            recompute = np.where(has_saver, recompute_at[last_or_0] + r_copies_prefix[ks + 1]
                                 - r_copies_prefix[a], 0)
            backward = np.maximum(np.maximum(savers_backward, after_savers), recompute) \
                + HEAD_BYTES
            holds = input_bytes[a] + rng_state[a] + changed_copies[ks + 1] - changed_copies[a]
            entry = input_bytes[a] + rng_state[a] + entry_copies[ks + 1] - entry_copies[a]
            segment[a, a + 1:] = (np.maximum(entry + np.maximum.accumulate(forward),
                                             np.where(has_saver, holds, 0) + backward)
                                  if self.input_writer[a] is None else np.inf)
            # a segment none of whose layers saves anything keeps no input (nor states)
            kept[a, a + 1:] = np.where(has_saver, holds, 0) + unhooked[ks + 1] - unhooked[a]
        # the last segment [t, n), for every t: its forward, then its backward
        ts = np.arange(n)
        suffix_max = lambda v: np.concatenate(  # noqa: E731
            [np.maximum.accumulate(v[::-1])[::-1][1:], [-np.inf]])
        forward_level = saved_prefix[ts] + input_alive + forward_peak
        head = np.where(ts < n - 1, HEAD_BYTES, 0)
        backward_level = saved_prefix[ts] + backward_term + head
        last_forward = input_bytes + np.maximum(
            forward_peak, suffix_max(forward_level) - saved_prefix[:-1] - extra)
        input_saved = np.where(saves_input, input_bytes, 0)
        first = np.where(ts > 0, held_backward_peak, backward_peak) + head
        last_backward = np.maximum(first, saved_bytes + input_saved - saved_prefix[1:]
                                   + suffix_max(backward_level))
        last = np.maximum(last_forward, last_backward)
        for t in np.nonzero(np.array(self.output_is_view))[0]:
            last[t] = self.last_segment_peak(int(t))
        return SegmentTables(segment, kept, last)


def step_peak_bytes(boundaries, profile) -> int:
    """Predicted peak bytes of one step: `checkpoint_sequential(layers, x, boundaries=...)`
    followed by `.float().sum().backward()`, parameter gradients allocated beforehand.

    `profile` comes from `profile_layers(layers, x)`. Counted are the storages the step
    allocates (x and the parameters are allocated before it), as `track_memory` counts them;
    from `profile_layers(layers, x, allocator=True)`, the allocator's bytes instead (its
    `allocator_peak_bytes`, see `planner.plan_chain`).
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
    module state (``ckpt_lab.checkpoint.module_state``), each measured per layer by
    `profile_layers`: the copies of every persistent buffer of a checkpointed segment's
    layers, alive through that segment's forward (`buffer_copy_bytes`); those of the buffers
    its forward changed (batch norm's counter), kept with the checkpoint's input until its
    backward (`changed_buffer_bytes`); and the fresh copies of the changed and the saved
    buffers made when its recompute starts (`recompute_buffer_bytes`: batch norm's counter and
    statistics), alive until the recompute ends, or until the layer's backward for those the
    recompute saves (`recompute_saved_buffer_bytes`: ``nn.BatchNorm2d``'s statistics; none for
    `models.RecomputeSafeBatchNorm2d`, which saves copies of its own). Exact on CPU in both
    units for chains with batch norms and for a module of one's own whose forward changes some
    buffers and saves others (tests/plan/test_plan_step.py, tests/plan/test_plan_allocator.py).
    """
    model = StepModel(profile)
    return model.peak(segment_starts(model.n, boundaries=list(boundaries)))
