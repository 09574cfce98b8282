"""The reentrant design (``impl="reentrant"``) in full: `minimal_reentrant` with every guard.

The forward runs here with the caller's grad mode (code that asks ``torch.is_grad_enabled()``,
as ``nn.TransformerEncoder``'s fast path does, takes the branch it takes without a checkpoint)
under a pack hook that keeps nothing, only a version probe per saved tensor. The graph it built
says which parameters it read, however it found them (`hidden_inputs.graph_leaves`): a `_Reentrant`
node takes the inputs *and those parameters* as its inputs, so ``backward(inputs=[p])`` and
``torch.autograd.grad`` reach them and an input that needs no grad is no trap. Its backward
checks (`guards`), recomputes under the forward's generators, autocast and module state, checks
each output's metadata and (``determinism_check="fingerprint"``) its bits, and differentiates
the recompute with ``torch.autograd.grad``: the autograd engine re-entered from inside itself.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .arguments import TENSOR, flatten, fresh_input, unflatten
from .fingerprint import differs, fingerprint_of, first_difference
from .guards import CheckpointError, Holder, Saved, describe, meta_of, mismatch, op_name
from .hidden_inputs import graph_leaves
from .module_state import saw_saved


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
        self.saved: list[Saved] = []                 # version probes only, nothing kept
        self.outputs = self.differentiable = self.meta = self.digests = None
        self.params: list = []

    def pack(self, t):
        """Forward: keep nothing of ``t``, only a record to probe its version."""
        h = Holder()
        self.saved.append(Saved(h, t))
        saw_saved(t)
        return h

    @staticmethod
    def unpack(h):
        """Refuse: nothing was kept (the function differentiated inside its forward)."""
        raise CheckpointError(
            "impl='reentrant' keeps nothing the forward saves, so the checkpointed function "
            "cannot differentiate inside itself (torch.autograd.grad in its forward); use "
            "impl='hooks'.")

    def arguments(self, tensors):
        """The positional and keyword arguments, with ``tensors`` in the tensor slots."""
        values = iter(tensors)
        flat = [next(values) if s is TENSOR else s for s in self.slots]
        if self.spec is tuple:                    # positional arguments only (`flatten`)
            return tuple(flat), {}
        return tree_unflatten(flat, self.spec)

    def backward(self, inputs, grads):
        """Recompute, check, differentiate: the gradients of the inputs, then of the params."""
        fresh = [fresh_input(t) for t in inputs]
        args, kwargs = self.arguments(fresh)
        since = torch._C._autograd._get_sequence_nr()
        with self.guards.recomputing():
            out = self.fn(*args, **kwargs)
        outs = [o for o in flatten(out)[0] if isinstance(o, torch.Tensor)]
        if len(outs) != len(self.meta):
            raise CheckpointError(
                f"impl='reentrant': the recompute returned {len(outs)} tensors but the forward "
                f"{len(self.meta)}; the checkpointed function must run the same operations "
                "both times.")
        for k, (o, m) in enumerate(zip(outs, self.meta)):
            if meta_of(o) != m:
                raise mismatch(f"impl='reentrant': output {k}", m, meta_of(o))
        if self.digests is not None:
            rows = [(k, d, now, now) for k, (d, now) in
                    enumerate(zip(self.digests, map(fingerprint_of, outs))) if d is not None]
            k = first_difference(rows)
            if k is not None:
                o = outs[rows[k][0]]
                raise differs(f"impl='reentrant': output {rows[k][0]} {describe(o)}",
                              op_name(type(o.grad_fn)))
        params, _ = graph_leaves([o for o in outs if o.requires_grad], since, fresh)
        missing = {id(p) for p in self.params} - {id(p) for p in params}
        for p in self.params:
            if id(p) in missing and isinstance(p, nn.Parameter):
                raise CheckpointError(
                    f"impl='reentrant': the recompute did not read the parameter "
                    f"{describe(p)} that the forward read: was it replaced by another object "
                    "(m.weight = nn.Parameter(...)) between forward and backward, in a module "
                    "ckpt_lab does not see? Replace parameters after backward.")
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wrt = [t for t in fresh if t.requires_grad] + self.params
        found = [None] * len(wrt)
        if pairs and wrt:
            try:
                found = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                            allow_unused=True)
            except RuntimeError as e:
                if "modified by an inplace operation" not in str(e):
                    raise
                raise CheckpointError(
                    "impl='reentrant': inside the checkpointed function a tensor saved for "
                    "backward was modified in place after it was saved (autograd's message "
                    "below names it). Make that in-place operation out-of-place (y = y * 3, "
                    "not y.mul_(3)) or clone the tensor before modifying it.") from e
        found = iter(found)
        in_grads = [next(found) if t.requires_grad else None for t in fresh]
        return (*in_grads, *found)


def checkpoint_reentrant(fn, args, kwargs, guards, forward_context):
    """Design 1 with the checks: forward here, then a `_Reentrant` node over inputs and params."""
    # The forward runs with the caller's grad mode (code that asks torch.is_grad_enabled(), as
    # nn.TransformerEncoder's fast path does, takes the branch it takes without a checkpoint)
    # under a pack hook that keeps nothing; the graph it built says which parameters it read,
    # however it found them. The node takes the inputs *and those parameters* as its inputs,
    # so backward(inputs=[p]) and torch.autograd.grad reach them, and an input that needs no
    # grad is no trap.
    flat, spec = flatten(args)
    if kwargs or spec is not tuple:               # (spec tuple: flat positional arguments)
        flat, spec = tree_flatten((args, kwargs))
    inputs = [v for v in flat if isinstance(v, torch.Tensor)]
    call = _ReentrantCall(fn, spec, [TENSOR if isinstance(v, torch.Tensor) else v
                                     for v in flat], guards)
    since = torch._C._autograd._get_sequence_nr()
    with guards.state.watching(), torch.autograd.graph.saved_tensors_hooks(
            call.pack, call.unpack), (forward_context or contextlib.nullcontext()):
        out = fn(*args, **kwargs)
    flat_out, out_spec = flatten(out)
    outs = [o for o in flat_out if isinstance(o, torch.Tensor)]
    params, before = graph_leaves(outs, since, inputs)
    if before:
        raise CheckpointError(
            f"impl='reentrant': the function reads a tensor that requires grad and has a "
            f"history outside the checkpoint (the output of {op_name(type(before[0]))}), not "
            "through its arguments; the reentrant design cannot send it a gradient. Pass it "
            "as an argument or use impl='hooks'.")
    guards.versions.add(params)
    call.params = params
    call.meta = [meta_of(o) for o in outs]
    if guards.fingerprint:
        call.digests = [fingerprint_of(o) for o in outs]
    call.differentiable = [o.requires_grad for o in outs]
    call.outputs = [o.detach() for o in outs]
    if not outs:
        return out
    results = iter(_Reentrant.apply(call, *inputs, *params))
    return unflatten([next(results) if isinstance(v, torch.Tensor) else v for v in flat_out],
                     out_spec)
