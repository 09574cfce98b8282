"""The saved-tensor-hooks design (``impl="hooks"``) in full: `minimal_hooks` with every guard.

The function runs normally under ``saved_tensors_hooks`` whose pack hook hands autograd a
`guards.Holder` for each tensor it saves, noting a `guards.Saved` record beside it
(`recording.record`). The first unpack in backward checks (`guards`), re-runs the function
under the forward's generators, autocast and module state (`_Recompute`), compares each
recomputed saved tensor with the forward's record (metadata; with
``determinism_check="fingerprint"`` its bits; a parameter must be the same object), fills the
holders in save order, and stops as soon as the last one is filled (`early_stop`, note 11). The
checkpoint's own inputs are saved through whatever hooks are active (`_SaveInputs`), so a
checkpoint inside a checkpoint frees them too: what makes ``checkpoint_recursive`` O(log L)
(note 12).
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .arguments import TENSOR, fresh_input
from .early_stop import WATCHED, StopAtOp, StopRecompute
from .fingerprint import check_digests, fingerprint_of
from .guards import CheckpointError, Guards, describe, describe_meta
from .recording import check_count, check_meta, record, replaced_parameter, run_forward, take


def checkpoint_hooks(fn, args, kwargs, inputs, guards, forward_context, early_stop):
    """Design 2 with the checks; the forward's graph adds the parameters it read to them."""
    frame = _Frame(fn, args, kwargs, guards, early_stop)
    try:
        forward = run_forward(fn, args, kwargs, inputs, guards, frame.pack, frame.unpack,
                              forward_context)
    finally:
        frame.running = False
    return forward.out


class _Frame:
    """``minimal_hooks`` plus the checks, for one call: everything needed to replay it."""

    def __init__(self, fn, args, kwargs, guards: Guards, early_stop):
        self.fn, self.guards, self.early_stop = fn, guards, early_stop
        self.num_args, self.keys = len(args), list(kwargs)
        values = list(args) + list(kwargs.values())
        self.slots = [TENSOR if isinstance(v, torch.Tensor) else v for v in values]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        self.input_ids = {id(t) for t in tensors}
        dummy = torch.empty(0, requires_grad=True)
        # Keep the (empty) output: it owns the autograd node, and some PyTorch versions (2.11)
        # free a custom Function's saved tensors once its node has no owner left.
        self.saver_out = _SaveInputs.apply(dummy, *tensors)
        self.saver = self.saver_out.grad_fn
        self.saved: list = []                     # a guards.Saved per saved tensor
        self.running = True                       # the forward has not returned yet

    def pack(self, t: torch.Tensor):
        """Forward: hand autograd an empty holder for ``t`` and note what to check it against."""
        digest = fingerprint_of(t) if self.guards.fingerprint else None
        leaf = t if isinstance(t, nn.Parameter) and id(t) not in self.input_ids else None
        trace = self.guards.trace
        return record(self.saved, t, digest, leaf, trace and trace.forward)

    def unpack(self, h) -> torch.Tensor:
        """Backward: the saved tensor, recomputing first if its holder is empty."""
        if h.tensor is None:
            self.recompute()
        return take(h)

    def recompute(self):
        """Re-run the function, filling every live holder in save order."""
        self.guards.check(self.saved)
        args, kwargs = self.inputs()
        run = _Recompute(self.saved, self.running, self.early_stop or self.running,
                         self.guards.trace)
        first_hook = RemovableHandle.next_id
        try:
            run.run(self.fn, args, kwargs, self.guards)
            run.finish()
        except CheckpointError as e:
            raise self.guards.explain(e) from None
        if run.stopped and RemovableHandle.next_id != first_hook:
            # a hook the function registers and removes after its last save (note 11)
            self.guards.state.drop_hooks_since(first_hook)
        if torch._C._current_graph_task_id() != -1:
            # Free, when this backward ends, what it recomputed but did not use up (tensors
            # kept for a custom Function, backward(inputs=...) on part of the graph).
            # (Not a method of the frame: that would keep its inputs alive until then.)
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(_clear, self.saved))

    def inputs(self):
        """The arguments to re-run the function with, fresh leaves for its saved inputs."""
        saved = iter(self.saver.saved_tensors)
        values = [fresh_input(next(saved)) if s is TENSOR else s for s in self.slots]
        n = self.num_args
        return values[:n], dict(zip(self.keys, values[n:]))


class _Recompute:
    """One recompute: checks each saved tensor against the forward's record, fills its holder,
    and ends the run once the last one is filled (early stop, note 11).

    During the forward (a ``torch.autograd.grad`` inside the function) only the tensors saved
    so far are known: the run always stops there and lets later saves through.
    """

    def __init__(self, saved: list, in_forward: bool, early_stop: bool, trace=None):
        self.saved, self.in_forward, self.early_stop = saved, in_forward, early_stop
        self.trace = trace                        # debug.Trace with debug=True
        self.n = len(saved)                       # during the forward: those saved so far
        self.count = 0                            # saves seen so far in this run
        self.stopped = False                      # ended early, by `StopRecompute`
        self.digests = []                         # (index, forward's, recompute's, node)
        # How to stop: at the last save itself if the last saved tensors all require grad
        # (no op writes into those after saving them), else at the next op boundary.
        self.at_save = all(s.requires_grad for s in saved[max(self.n - WATCHED, 0):self.n])
        self.stopper = StopAtOp()
        # The stopper is not started from inside a backward the function runs itself
        # (torch.autograd.grad), whose engine keeps its own dispatch state.
        self.task = torch._C._current_graph_task_id()

    def run(self, fn, args, kwargs, guards):
        """Run ``fn`` with every save through `pack`, until the end or the early stop."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, _identity), \
                guards.recomputing():
            try:
                if self.early_stop and not self.at_save and self.n <= WATCHED:
                    self._watch(mid_op=False)
                fn(*args, **kwargs)
            except StopRecompute:
                self.stopped = True
            finally:
                if self.stopper.active:
                    self.stopper.__exit__(None, None, None)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """Check the ``count``-th save against the forward's and hand it to its holder."""
        i = self.count
        self.count += 1
        if i >= self.n:
            if self.in_forward:
                return x
            check_count("hooks", "saved", self.count, self.n)
        s = self.saved[i]
        if self.trace is not None:
            self.trace.recompute.saved(i, x)
        check_meta(f"impl='hooks': saved tensor {i}", x, s.meta)
        if s.leaf is not None and x is not s.leaf:
            raise replaced_parameter(f"impl='hooks': saved tensor {i} {describe(x)} is")
        self.stopper.quiet = True
        if s.digest is not None:
            self.digests.append((i, s.digest, fingerprint_of(x), type(x.grad_fn)))
        kept = x.detach() if x.requires_grad else x   # (x itself would hold its own grad_fn)
        self.stopper.quiet = False
        h = s.holder()
        if h is not None:
            h.tensor = kept
        self._stop_after_save()
        return kept                               # the recompute's own graph stays usable

    def _stop_after_save(self):
        """End the run at the last save, or from the op boundary after it (`StopAtOp`)."""
        if not self.early_stop:
            return
        if self.count == self.n:
            if self.at_save:
                raise StopRecompute
            # the op in flight will be seen, unless the stopper started during it
            stopper = self.stopper
            stopper.pending = stopper.active and (not stopper.mid_op or stopper.seen > 0)
        elif not self.at_save and self.count >= self.n - WATCHED:
            self._watch(mid_op=True)

    def _watch(self, mid_op: bool):
        """Start the stopper (a dispatch mode: a Python call per op) for the last ops."""
        if torch._C._current_graph_task_id() == self.task:
            self.stopper.start(mid_op)

    def finish(self):
        """After the run: every saved tensor recomputed, the same bits if fingerprinted."""
        if self.count < self.n:
            check_count("hooks", "saved", self.count, self.n)
        self._compare()
        for s in self.saved:                      # in-place updates the recompute itself made
            if s.probe is not None:               # (batch-norm statistics) are not edits
                s.version = s.probe._version

    def _compare(self):
        """Refuse if a recomputed saved tensor's fingerprint differs from the forward's."""
        # A float that needs no grad is compared only if it still has the value it had when
        # saved: one an op fills after saving it (RReLU's noise, batch norm's statistics of a
        # module ckpt_lab does not see) was saved unfilled, in both runs.
        rows = []
        for i, before, now, node in self.digests:
            if now is None:
                continue
            after = now
            s = self.saved[i]
            if not s.requires_grad and s.meta[1].is_floating_point:
                h = s.holder()
                if h is None or h.tensor is None:
                    continue                      # backward does not need it
                after = fingerprint_of(h.tensor)
                if after is None:
                    continue
            rows.append((i, before, now, after, node))
        check_digests(rows, lambda i: f"impl='hooks': saved tensor {i} of {self.n} "
                                      f"{describe_meta(self.saved[i].meta)}")


def _identity(x):
    return x


def _clear(saved: list):
    """Empty the holders a recompute filled and backward did not use."""
    for s in saved:
        h = s.holder()
        if h is not None:
            h.tensor = None


class _SaveInputs(torch.autograd.Function):
    """Saves a checkpoint's inputs through whatever saved-tensor hooks are active (nesting).

    Inside an outer checkpoint this makes the inner checkpoint's inputs outer handles too, so
    nested checkpoints free them and recompute them on demand (what makes recursion O(log L)).
    """

    @staticmethod
    def forward(ctx, dummy, *tensors):
        ctx.save_for_backward(*tensors)
        return dummy.new_empty(0)

    @staticmethod
    def backward(ctx, *grads):  # never part of a differentiated path
        return (None,) * (1 + len(ctx.saved_tensors))

    @staticmethod
    def jvp(ctx, *tangents):    # forward-mode AD: its empty output carries no tangent
        return torch.zeros(0)
