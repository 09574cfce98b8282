"""The reentrant design (``impl="reentrant"``) in full: `minimal_reentrant` with every guard.

The forward runs here with the caller's grad mode (note 4: code that asks
``torch.is_grad_enabled()``, as ``nn.TransformerEncoder``'s fast path does, takes the branch it
takes without a checkpoint) under a pack hook that keeps nothing, only a version probe per saved
tensor (`recording.record`). The graph it built says which parameters it read, however it found
them (`hidden_inputs.graph_leaves`): a `_Reentrant` node takes the inputs *and those parameters*
as its inputs (note 8), so ``backward(inputs=[p])`` and ``torch.autograd.grad`` reach them and an
input that needs no grad is no trap. Its backward checks (`guards`), recomputes under the
forward's generators, autocast and module state, checks each output's metadata and
(``determinism_check="fingerprint"``) its bits, and differentiates the recompute with
``torch.autograd.grad``: the autograd engine re-entered from inside itself.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .arguments import TENSOR, flatten, fresh_input, unflatten
from .fingerprint import check_digests, fingerprint_of
from .guards import CheckpointError, describe, meta_of, op_name
from .hidden_inputs import graph_leaves
from .recording import check_count, check_meta, record, replaced_parameter, run_forward


def checkpoint_reentrant(fn, args, kwargs, guards, forward_context):
    """Design 1 with the checks: forward here, then a `_Reentrant` node over inputs and params."""
    flat, spec = flatten(args)
    if kwargs or spec is not tuple:               # (spec tuple: flat positional arguments)
        flat, spec = tree_flatten((args, kwargs))
    inputs = [v for v in flat if isinstance(v, torch.Tensor)]
    call = _ReentrantCall(fn, spec, [TENSOR if isinstance(v, torch.Tensor) else v
                                     for v in flat], guards)
    forward = run_forward(fn, args, kwargs, inputs, guards, call.pack, call.unpack,
                          forward_context)
    if forward.before:
        raise CheckpointError(
            f"impl='reentrant': the function reads a tensor that requires grad and has a "
            f"history outside the checkpoint (the output of {op_name(type(forward.before[0]))}"
            "), not through its arguments; the reentrant design cannot send it a gradient. "
            "Pass it as an argument or use impl='hooks'.")
    outs = forward.tensors
    if not outs:
        return forward.out
    call.keep(outs, forward.leaves)
    results = iter(_Reentrant.apply(call, *inputs, *forward.leaves))
    return unflatten([next(results) if isinstance(v, torch.Tensor) else v
                      for v in forward.flat], forward.spec)


class _Reentrant(torch.autograd.Function):
    """The reentrant node: hands on the outputs its forward (`checkpoint_reentrant`) made;
    its backward re-runs the function and differentiates it in a nested backward."""

    @staticmethod
    def forward(ctx, call, *tensors):
        ctx.call = call
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors[:call.num_inputs])   # the parameters are not saved
        outs = call.outputs
        call.outputs = None
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, call.differentiable) if not d])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        call = ctx.call
        call.guards.check(call.saved)                       # before autograd's own check
        return (None, *call.backward(ctx.saved_tensors, grads))


class _ReentrantCall:
    """One reentrant call: what its backward needs to re-run and differentiate it."""

    def __init__(self, fn, spec, slots, guards):
        self.fn, self.spec, self.slots, self.guards = fn, spec, slots, guards
        self.num_inputs = sum(s is TENSOR for s in slots)
        self.saved: list = []                        # version probes only, nothing kept
        self.outputs = self.differentiable = self.meta = self.digests = None
        self.params: list = []

    # ---------------------------------------------------------------------- forward
    def pack(self, t):
        """Forward: keep nothing of ``t``, only a record to probe its version."""
        return record(self.saved, t)

    @staticmethod
    def unpack(h):
        """Refuse: nothing was kept (the function differentiated inside its forward)."""
        raise CheckpointError(
            "impl='reentrant' keeps nothing the forward saves, so the checkpointed function "
            "cannot differentiate inside itself (torch.autograd.grad in its forward); use "
            "impl='hooks'.")

    def keep(self, outs: list, params: list):
        """After the forward: what the node hands on and what its recompute is checked against."""
        self.params = params
        self.meta = [meta_of(o) for o in outs]
        if self.guards.fingerprint:
            self.digests = [fingerprint_of(o) for o in outs]
        self.differentiable = [o.requires_grad for o in outs]
        self.outputs = [o.detach() for o in outs]

    # --------------------------------------------------------------------- backward
    def backward(self, inputs, grads):
        """Recompute, check, differentiate: the gradients of the inputs, then of the params."""
        fresh = [fresh_input(t) for t in inputs]
        outs, params = self.recompute(fresh)
        self.check_outputs(outs)
        self.check_params(params)
        return self.differentiate(outs, grads, fresh)

    def recompute(self, fresh: list) -> tuple[list, list]:
        """Re-run the function on ``fresh`` inputs: its output tensors and the leaves it read.
        Its saved tensors go through `_versioned`/`_unpack_checked` (plain autograd's check,
        with a message that says what to do)."""
        args, kwargs = self.arguments(fresh)
        since = torch._C._autograd._get_sequence_nr()
        with self.guards.recomputing(), \
                torch.autograd.graph.saved_tensors_hooks(_versioned, _unpack_checked):
            out = self.fn(*args, **kwargs)
        outs = [o for o in flatten(out)[0] if isinstance(o, torch.Tensor)]
        params, _ = graph_leaves([o for o in outs if o.requires_grad], since, fresh)
        return outs, params

    def arguments(self, tensors):
        """The positional and keyword arguments, with ``tensors`` in the tensor slots."""
        values = iter(tensors)
        flat = [next(values) if s is TENSOR else s for s in self.slots]
        if self.spec is tuple:                    # positional arguments only (`flatten`)
            return tuple(flat), {}
        return tree_unflatten(flat, self.spec)

    def check_outputs(self, outs: list):
        """Refuse outputs whose number, metadata or (fingerprint) bits are not the forward's."""
        check_count("reentrant", "returned", len(outs), len(self.meta))
        for k, (o, m) in enumerate(zip(outs, self.meta)):
            check_meta(f"impl='reentrant': output {k}", o, m)
        if self.digests is not None:
            rows = [(k, d, now, now, type(o.grad_fn)) for k, (d, now, o) in
                    enumerate(zip(self.digests, map(fingerprint_of, outs), outs))
                    if d is not None]
            check_digests(rows, lambda k: f"impl='reentrant': output {k} {describe(outs[k])}")

    def check_params(self, params: list):
        """Refuse a recompute that did not read a parameter the forward read (replaced)."""
        read = {id(p) for p in params}
        for p in self.params:
            if id(p) not in read and isinstance(p, nn.Parameter):
                raise replaced_parameter(f"impl='reentrant': the forward read {describe(p)},")

    def differentiate(self, outs, grads, fresh) -> tuple:
        """The recompute's gradients for the inputs that require grad, then the parameters."""
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wrt = [t for t in fresh if t.requires_grad] + self.params
        found = [None] * len(wrt)
        if pairs and wrt:
            found = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                        allow_unused=True)
        found = iter(found)
        in_grads = [next(found) if t.requires_grad else None for t in fresh]
        return (*in_grads, *found)


def _versioned(t: torch.Tensor) -> tuple:
    """The recompute's pack: the tensor and its version."""
    return t, t._version


def _unpack_checked(saved: tuple) -> torch.Tensor:
    """The recompute's unpack: refuse a tensor modified in place after it was saved."""
    t, version = saved
    if t._version != version:
        op = op_name(type(torch._C._current_autograd_node()))
        raise CheckpointError(
            f"impl='reentrant': inside the checkpointed function a tensor {describe(t)} that "
            f"{op} saved for backward was modified in place after it was saved (now at "
            f"version {t._version}, saved at {version}): plain autograd refuses this too "
            "('modified by an inplace operation'). Make that in-place operation out-of-place "
            "(y = y * 3, not y.mul_(3)) or clone the tensor before modifying it.")
    return t
