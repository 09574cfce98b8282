"""Activation checkpointing written from scratch, in the two designs PyTorch has used.

The API: `checkpoint(fn, *args, impl="hooks" | "reentrant", ...)` runs ``fn`` keeping only its
inputs and recomputes the rest in backward; `checkpoint_sequential` does it for the segments of
a chain. Gradients equal plain autograd's bit for bit, or the call refuses with the cause and
the fix. Read `minimal` first (both designs at their smallest, note 1), then NOTES.md in this
folder: the design notes, numbered, one per guard, to which every module here points back.
``torch.utils.checkpoint`` is the oracle in the tests; nothing here calls it.
"""
from __future__ import annotations

import inspect
import numbers
import sys
import types

import torch
from torch import nn

from .arguments import named_leaves
from .debug import Trace
from .guards import CheckpointError  # noqa: F401  (ckpt_lab.checkpoint.CheckpointError)
from .guards import Guards, Versions
from .hidden_inputs import modules_of
from .hooks import checkpoint_hooks
from .minimal import MinimalReentrant, minimal_hooks, minimal_reentrant  # noqa: F401
from .module_state import ModuleState
from .reentrant import checkpoint_reentrant
from .replay import Replay
from .selective import SelectiveFunction

IMPLS = ("hooks", "reentrant")


# ==================================================== the full checkpoint: guards, then a design
_TORCH_ONLY = {
    "use_reentrant": "ckpt_lab calls it impl: impl='reentrant' or impl='hooks'",
}
DETERMINISM_CHECKS = ("default", "none", "fingerprint")


def check_options(determinism_check, context_fn, policy):
    """Refuse options `checkpoint` (and `checkpoint_modules`) cannot run with."""
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check must be one of {DETERMINISM_CHECKS} (as in "
                         f"torch.utils.checkpoint), got {determinism_check!r}")
    if context_fn is None:
        return
    if policy is not None:
        raise ValueError("pass policy= (ckpt_lab's selective checkpointing) or context_fn= "
                         "(PyTorch's, e.g. create_selective_checkpoint_contexts), not both.")
    if not callable(context_fn):
        raise TypeError(f"context_fn must be a callable that returns two context managers "
                        f"(forward, recompute), as torch.utils.checkpoint's does; got "
                        f"{type(context_fn).__name__}.")


def _contexts(context_fn) -> tuple:
    """The (forward, recompute) context managers ``context_fn`` returns (None, None if none)."""
    if context_fn is None:
        return None, None
    pair = context_fn()
    if not (isinstance(pair, tuple) and len(pair) == 2
            and all(hasattr(c, "__enter__") and hasattr(c, "__exit__") for c in pair)):
        raise TypeError("context_fn() must return a tuple of two context managers: the "
                        "forward's and the recompute's, as "
                        "torch.utils.checkpoint.create_selective_checkpoint_contexts does.")
    return pair


@torch._disable_dynamo
def checkpoint(fn, *args, impl: str = "hooks", preserve_rng_state: bool = True, policy=None,
               early_stop: bool = True, context_fn=None, determinism_check: str = "default",
               debug: bool = False, **kwargs):
    """Run ``fn(*args, **kwargs)`` keeping only its inputs; recompute the rest in backward.

    ``impl`` picks the design (``"hooks"``, the default, or ``"reentrant"``).
    ``preserve_rng_state`` replays the random generators so dropout draws the same mask.
    ``policy`` (selective checkpointing, see ``ckpt_lab.checkpoint.selective``) keeps the outputs of the
    operations it chooses instead of recomputing them: a callable ``policy(op, *args,
    **kwargs) -> bool``, a collection of ATen ops, or a name such as ``"save_matmuls"``.
    ``context_fn`` is PyTorch's: a callable returning the (forward, recompute) context
    managers, e.g. ``functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts,
    policy_fn)``, so an existing selective policy runs unchanged.
    ``early_stop`` (hooks only) ends the recompute as soon as backward has every tensor it
    needs; the reentrant design always re-runs all of ``fn``, since it needs its outputs.
    ``determinism_check``: ``"default"`` (or ``"none"``) compares the shape, dtype and device
    of every recomputed tensor with the forward's, as PyTorch's default does;
    ``"fingerprint"`` also compares their bits (a digest each, see note 10) and refuses what
    no other check sees.
    ``debug=True``: a refusal of the recompute also shows the operations the forward and the
    recompute ran, side by side, the first that differs marked (note 16).
    The names ``impl``, ``preserve_rng_state``, ``policy``, ``early_stop``, ``context_fn``,
    ``determinism_check``, ``debug`` and PyTorch's ``use_reentrant`` belong to
    ``checkpoint``, so ``fn`` cannot receive keyword arguments with those names.
    Under ``torch.compile`` the call is a graph break: the checkpointed region runs eagerly
    (note 13). What is checked, and how this differs from PyTorch's: NOTES.md, notes 2-15.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if not callable(fn):
        raise TypeError(f"checkpoint needs a callable first argument, got {type(fn).__name__}")
    for name in _TORCH_ONLY.keys() & kwargs.keys():
        raise TypeError(f"checkpoint() got {name}=, an argument of torch.utils.checkpoint: "
                        f"{_TORCH_ONLY[name]}.")
    check_options(determinism_check, context_fn, policy)
    forward_context, recompute_context = _contexts(context_fn)
    selective = None if policy is None else SelectiveFunction(fn, policy, error=CheckpointError)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise CheckpointError(
            "checkpoint cannot run inside a torch.func transform (vmap, grad, jvp, jacrev, ...): "
            "its recompute runs in backward, after the transform has returned. Put the "
            "transform inside the checkpoint, checkpoint(torch.func.vmap(f), x), which is exact "
            "in both designs; for forward-mode derivatives use torch.autograd.forward_ad, "
            "which works through checkpoint.")
    leaves = named_leaves(args, kwargs)
    modules = modules_of(fn, leaves)
    params = list({id(p): p for m in modules for p in m.parameters()}.values())
    tensors = [t for _, t in leaves if isinstance(t, torch.Tensor)]
    generators = [g for _, g in leaves if isinstance(g, torch.Generator)]
    guards = Guards(Replay.capture(tensors + params, generators, preserve_rng_state),
                    Versions.capture(leaves, modules), ModuleState(modules),
                    recompute_context, determinism_check == "fingerprint",
                    Trace() if debug else None)
    fn = fn if selective is None else selective
    if impl == "hooks":
        return checkpoint_hooks(fn, args, kwargs, tensors, guards, forward_context,
                                early_stop)
    return checkpoint_reentrant(fn, args, kwargs, guards, forward_context)


# ===================================================================== chains of layers
def segment_starts(num_layers: int, segments: int | None = None,
                   boundaries=None) -> list[int]:
    """Validated segment starts (beginning with 0) from a segment count or explicit starts."""
    if num_layers < 1:
        raise ValueError("need at least one layer to checkpoint")
    if (segments is None) == (boundaries is None):
        raise ValueError("pass exactly one of segments=<int> or boundaries=<list of starts>")
    if segments is not None:
        if isinstance(segments, bool) or not isinstance(segments, numbers.Integral) \
                or not 1 <= segments <= num_layers:
            raise ValueError(f"segments must be an int between 1 and the number of layers "
                             f"({num_layers}), got {segments!r}")
        segments = int(segments)
        size = num_layers // segments
        return [i * size for i in range(segments)]
    starts = [int(b) for b in boundaries]
    if not starts:
        raise ValueError("boundaries is empty; give segment starts such as [0, 4, 8]")
    if starts[0] != 0:
        starts = [0] + starts
    if any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= num_layers:
        raise ValueError(f"boundaries must be strictly increasing layer indices in "
                         f"[0, {num_layers - 1}], got {list(boundaries)}")
    return starts


def layer_list(layers) -> list:
    """The layers of an ``nn.Sequential`` or of an iterable of modules, as a checked list."""
    layers = list(layers.children()) if isinstance(layers, nn.Sequential) else list(layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise ValueError(f"layers[{i}] is a {type(layer).__name__}, not an nn.Module")
    return layers


def run_in_order(layers):
    """A function that applies ``layers`` one after another: what a segment runs."""
    def run(x):
        for layer in layers:
            x = layer(x)
        return x
    return run


def checkpoint_sequential(layers, x, segments=None, boundaries=None, impl="hooks",
                          preserve_rng_state: bool = True, policy=None,
                          early_stop: bool = True, determinism_check: str = "default"):
    """Run ``layers`` on ``x`` in segments; every segment but the last is checkpointed.

    The last segment runs normally, as in ``torch.utils.checkpoint.checkpoint_sequential``:
    backward starts there and needs all its activations at once, so recomputing it would free
    nothing at the peak and cost one more forward of it. ``policy``, ``early_stop`` and
    ``determinism_check`` are passed to ``checkpoint``.
    """
    layers = layer_list(layers)
    starts = segment_starts(len(layers), segments, boundaries)
    ends = starts[1:] + [len(layers)]
    for k, (a, b) in enumerate(zip(starts, ends)):
        last = k == len(starts) - 1
        if last:
            x = run_in_order(layers[a:b])(x)
            continue
        run = _keeping_input(layers, a, b) if torch.is_grad_enabled() \
            and isinstance(x, torch.Tensor) else run_in_order(layers[a:b])
        x = checkpoint(run, x, impl=impl, policy=policy, preserve_rng_state=preserve_rng_state,
                       early_stop=early_stop, determinism_check=determinism_check)
    return x


def _keeping_input(layers, a: int, b: int):
    """``run_in_order(layers[a:b])`` that refuses, in the forward, a layer writing the segment's
    input in place (``nn.ReLU(inplace=True)`` first, or after layers returning views of it):
    the checkpoint keeps that input to run the segment again, which would start from the
    overwritten values (the checkpoint's own check would say so only in backward)."""
    segment = layers[a:b]              # only these: the checkpoint finds its modules by closure

    def run(x):
        version, h = x._version, x
        for j, layer in enumerate(segment, start=a):
            h = layer(h)
            if x._version != version:
                fix = (f"Start that segment at layer {j + 1} instead" if a > 0 else
                       "The first segment keeps the chain's own input, so no plan but "
                       "boundaries=[0] (no checkpoint) can run this chain as it is")
                raise ValueError(
                    f"checkpoint_sequential: layer {j} ({layer!r}) writes the input of the "
                    f"checkpointed segment starting at layer {a} in place; the checkpoint keeps "
                    "that input to run the segment again in backward, and would run it on the "
                    f"overwritten values. {fix}, or make the layer out of place "
                    "(inplace=False). planner.plan_chain never starts a segment there.")
        return h
    return run


# ``ckpt_lab.checkpoint`` is this module (``import ckpt_lab.checkpoint`` gives it), and calling
# it calls the function, so ``from ckpt_lab import checkpoint; checkpoint(fn, x)`` works too.
class _CallableModule(types.ModuleType):
    @torch._disable_dynamo
    def __call__(self, *args, **kwargs):
        return checkpoint(*args, **kwargs)


__signature__ = inspect.signature(checkpoint)
sys.modules[__name__].__class__ = _CallableModule
