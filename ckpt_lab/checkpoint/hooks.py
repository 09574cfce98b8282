"""The saved-tensor-hooks design (``impl="hooks"``) in full: `minimal_hooks` with every guard.

The function runs normally under ``saved_tensors_hooks`` whose pack hook hands autograd a
`guards.Holder` for each tensor it saves, noting a `guards.Saved` record beside it. The first
unpack in backward checks (`guards`), re-runs the function under the forward's generators,
autocast and module state, compares each recomputed saved tensor with the forward's record
(metadata; with ``determinism_check="fingerprint"`` its bits; a parameter must be the same
object), fills the holders in save order, and stops as soon as the last one is filled
(`early_stop`). The checkpoint's own inputs are saved through whatever hooks are active
(`_SaveInputs`), so a checkpoint inside a checkpoint frees them too: what makes
``checkpoint_recursive`` O(log L). After the forward the graph it built says which parameters
it read (`hidden_inputs.graph_leaves`), and their versions are checked too.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from .arguments import TENSOR, flatten, fresh_input
from .early_stop import WATCHED, StopAtOp, StopRecompute
from .fingerprint import differs, fingerprint_of, first_difference
from .guards import (CheckpointError, Guards, Holder, Saved, describe, describe_meta, meta_of,
                     mismatch, op_name)
from .hidden_inputs import graph_leaves
from .module_state import saw_saved


_CUSTOM_NODE = torch.autograd.function.BackwardCFunction


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
        self.saved: list[Saved] = []
        self.running = True                       # the forward has not returned yet

    def pack(self, t: torch.Tensor) -> Holder:
        """Forward: hand autograd an empty holder for ``t`` and note what to check it against."""
        h = Holder()
        digest = fingerprint_of(t) if self.guards.fingerprint else None
        leaf = t if isinstance(t, nn.Parameter) and id(t) not in self.input_ids else None
        self.saved.append(Saved(h, t, digest, leaf))
        saw_saved(t)
        return h

    def unpack(self, h: Holder) -> torch.Tensor:
        """Backward: the saved tensor, recomputing first if its holder is empty."""
        if h.tensor is None:
            self.recompute()
        t = h.tensor
        # A custom autograd.Function may read ctx.saved_tensors twice: keep its tensors until
        # its node releases them (or this backward ends). Built-in nodes read once: let go now.
        if not isinstance(torch._C._current_autograd_node(), _CUSTOM_NODE):
            h.tensor = None
        return t

    def inputs(self):
        """The arguments to re-run the function with, fresh leaves for its saved inputs."""
        saved = iter(self.saver.saved_tensors)
        values = [fresh_input(next(saved)) if s is TENSOR else s for s in self.slots]
        n = self.num_args
        return values[:n], dict(zip(self.keys, values[n:]))

    def recompute(self):
        """Re-run the function, filling every live holder in save order."""
        self.guards.check(self.saved)
        args, kwargs = self.inputs()
        n = len(self.saved)                       # during the forward: those saved so far
        stop = self.early_stop or self.running
        count = 0
        digests = []                              # (index, forward's, recompute's, node)

        def pack(x):
            nonlocal count
            i = count
            count += 1
            if i >= n:
                if self.running:
                    return x
                raise CheckpointError(
                    "impl='hooks': the recompute saved more tensors than the forward did; the "
                    "checkpointed function must run the same operations both times.")
            entry = self.saved[i]
            if meta_of(x) != entry.meta:
                raise mismatch(f"impl='hooks': saved tensor {i}", entry.meta, meta_of(x))
            if entry.leaf is not None and x is not entry.leaf:
                raise CheckpointError(
                    f"impl='hooks': saved tensor {i} {describe(x)} is a parameter that the "
                    "recompute reads as another object than the forward did: was it replaced "
                    "(m.weight = nn.Parameter(...)) between forward and backward, in a module "
                    "ckpt_lab does not see? Replace parameters after backward.")
            stopper.quiet = True
            if entry.digest is not None:
                digests.append((i, entry.digest, fingerprint_of(x), type(x.grad_fn)))
            x = x.detach() if x.requires_grad else x   # (x itself would hold its own grad_fn)
            stopper.quiet = False
            h = entry.holder()
            if h is not None:
                h.tensor = x
            if stop and count == n:
                if at_save:
                    raise StopRecompute
                # the op in flight will be seen, unless the stopper started during it
                stopper.pending = stopper.active and (not stopper.mid_op or stopper.seen > 0)
            elif stop and not at_save and count >= n - WATCHED:
                watch(mid_op=True)
            return x                              # the recompute's own graph stays usable

        # The stopper (a dispatch mode: a Python call per op) watches only the ops from the
        # WATCHED-th last saved tensor on. It is not started from inside a backward the
        # function runs itself (torch.autograd.grad), whose engine keeps its own dispatch
        # state; the recompute then just runs to the end.
        stopper, task = StopAtOp(), torch._C._current_graph_task_id()
        at_save = all(e.requires_grad for e in self.saved[max(n - WATCHED, 0):n])

        def watch(mid_op):
            if torch._C._current_graph_task_id() == task:
                stopper.start(mid_op)

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), \
                self.guards.recomputing():
            try:
                if stop and not at_save and n <= WATCHED:
                    watch(mid_op=False)
                self.fn(*args, **kwargs)
            except StopRecompute:
                pass
            finally:
                if stopper.active:
                    stopper.__exit__(None, None, None)
        if count < n:
            raise CheckpointError(
                f"impl='hooks': the recompute saved {count} tensors but the forward saved "
                f"{n}; the checkpointed function must run the same operations both times.")
        self._compare(digests, n)
        for s in self.saved:                      # in-place updates the recompute itself made
            if s.probe is not None:               # (batch-norm statistics) are not edits
                s.version = s.probe._version
        if torch._C._current_graph_task_id() != -1:
            # Free, when this backward ends, what it recomputed but did not use up (tensors
            # kept for a custom Function, backward(inputs=...) on part of the graph).
            # (Not a method of the frame: that would keep its inputs alive until then.)
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(_clear, self.saved))

    def _compare(self, digests, n):
        """Refuse if a recomputed saved tensor's fingerprint differs from the forward's."""
        # A float that needs no grad is compared only if it still has the value it had when
        # saved: one an op fills after saving it (RReLU's noise, batch norm's statistics of a
        # module ckpt_lab does not see) was saved unfilled, in both runs.
        rows = []
        for i, before, now, node in digests:
            if now is None:
                continue
            after = now
            if not self.saved[i].requires_grad and self.saved[i].meta[1].is_floating_point:
                h = self.saved[i].holder()
                if h is None or h.tensor is None:
                    continue                      # backward does not need it
                after = fingerprint_of(h.tensor)
                if after is None:
                    continue
            rows.append((i, before, now, after, node))
        k = first_difference(rows)
        if k is not None:
            i, node = rows[k][0], rows[k][4]
            raise differs(f"impl='hooks': saved tensor {i} of {n} "
                          f"{describe_meta(self.saved[i].meta)}", op_name(node))


def _clear(saved: list):
    """Empty the holders a recompute filled and backward did not use."""
    for s in saved:
        h = s.holder()
        if h is not None:
            h.tensor = None


def checkpoint_hooks(fn, args, kwargs, inputs, guards, forward_context, early_stop):
    """Design 2 with the checks; the forward's graph adds the parameters it read to them."""
    frame = _Frame(fn, args, kwargs, guards, early_stop)
    since = torch._C._autograd._get_sequence_nr()
    try:
        with guards.state.watching(), torch.autograd.graph.saved_tensors_hooks(
                frame.pack, frame.unpack), (forward_context or contextlib.nullcontext()):
            out = fn(*args, **kwargs)
    finally:
        frame.running = False
    outs = [o for o in flatten(out)[0] if isinstance(o, torch.Tensor)]
    guards.versions.add(graph_leaves(outs, since, inputs)[0])
    return out
