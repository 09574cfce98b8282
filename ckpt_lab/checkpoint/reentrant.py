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
import torch.autograd.forward_ad as fwAD
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
    try:
        forward = run_forward(fn, args, kwargs, inputs, guards, call.pack, call.unpack,
                              forward_context)
    finally:
        call.running = False
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
    def jvp(ctx, *tangents):
        """Forward-mode AD: the forward ran on the dual tensors, so its outputs' tangents are
        already computed, from these very tangents."""
        found, ctx.call.tangents = ctx.call.tangents, None
        return tuple(found)

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
        self.running = True                          # the forward has not returned yet

    # ---------------------------------------------------------------------- forward
    def pack(self, t):
        """Forward: keep nothing of ``t``, only a record to probe its version."""
        return record(self.saved, t)

    def unpack(self, h):
        """Refuse: nothing was kept of what the forward saved."""
        if self.running:
            raise CheckpointError(
                "impl='reentrant' keeps nothing the forward saves, so the checkpointed function "
                "cannot differentiate inside itself (torch.autograd.grad in its forward); use "
                "impl='hooks'.")
        raise CheckpointError(
            "impl='reentrant': backward reached a tensor the checkpointed function made but did "
            "not return (stored on a module or an object, e.g. an auxiliary loss kept as "
            "self.aux_loss); the reentrant design keeps nothing of the forward but what it "
            "returns. Return it from the function (out, aux = f(x)), or use impl='hooks', which "
            "recomputes it.")

    def keep(self, outs: list, params: list):
        """After the forward: what the node hands on and what its recompute is checked against."""
        self.params = params
        self.meta = [meta_of(o) for o in outs]
        if self.guards.fingerprint:
            self.digests = [fingerprint_of(o) for o in outs]
        self.differentiable = [o.requires_grad for o in outs]
        self.tangents = [fwAD.unpack_dual(o).tangent for o in outs] \
            if fwAD._current_level >= 0 else [None] * len(outs)
        self.outputs = [o.detach() for o in outs]

    # --------------------------------------------------------------------- backward
    def backward(self, inputs, grads):
        """Recompute, check, differentiate: the gradients of the inputs, then of the params."""
        if torch.is_grad_enabled():
            raise CheckpointError(
                "impl='reentrant' cannot take part in a backward with create_graph=True (a "
                "gradient penalty, MAML, a Hessian-vector product): its gradients come from a "
                "graph of their own, so differentiating them again sums the two passes in "
                "another order than plain autograd, and the result differs in its last bits. "
                "Use impl='hooks', which differentiates the forward's own graph.")
        fresh = [fresh_input(t) for t in inputs]
        try:
            outs, params = self.recompute(fresh)
            self.check_outputs(outs)
            leaves = self.leaves_read(params)
        except CheckpointError as e:
            raise self.guards.explain(e) from None
        return self.differentiate(outs, grads, fresh, leaves)

    def recompute(self, fresh: list) -> tuple[list, list]:
        """Re-run the function on ``fresh`` inputs: its output tensors and the leaves it read.
        Its saved tensors go through `_versioned`/`_unpack_checked` (plain autograd's check,
        with a message that says what to do). A hook it registers on an input is dropped:
        the forward registered it on the real input, which gets the gradient after this."""
        args, kwargs = self.arguments(fresh)
        since = torch._C._autograd._get_sequence_nr()
        with self.guards.recomputing(), \
                torch.autograd.graph.saved_tensors_hooks(_versioned, _unpack_checked):
            out = self.fn(*args, **kwargs)
        for t in fresh:
            if isinstance(t, torch.Tensor) and t.requires_grad and t._backward_hooks:
                t._backward_hooks.clear()
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

    def leaves_read(self, params: list) -> list:
        """The recompute's leaf for each leaf the forward read, in the forward's order.

        Mostly the same objects. A leaf the function creates itself (a scale made with
        ``requires_grad=True``) is another object the second time: it stands in for the
        forward's if it holds the same values, so the forward's leaf gets the gradient. Any
        other leaf the recompute did not read was replaced since the forward: refused."""
        read = {id(p) for p in params}
        missing = [p for p in self.params if id(p) not in read]
        if not missing:
            return self.params
        known = {id(p) for p in self.params}
        new = [p for p in params if id(p) not in known]
        same = len(new) == len(missing) and all(
            meta_of(a) == meta_of(b) and torch.equal(a, b) for a, b in zip(missing, new))
        if not same:
            raise replaced_parameter(
                f"impl='reentrant': the forward read {describe(missing[0])}, a tensor requiring "
                "grad (a parameter?) that the recompute did not read; it is")
        stand_in = dict(zip(map(id, missing), new))
        return [stand_in.get(id(p), p) for p in self.params]

    def differentiate(self, outs, grads, fresh, leaves) -> tuple:
        """The recompute's gradients for the inputs that require grad, then the parameters."""
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wrt = [t for t in fresh if t.requires_grad] + leaves
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
