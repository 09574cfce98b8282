"""Activation checkpointing written from scratch, in the two designs PyTorch has used.

The two designs at their smallest are in `minimal` (``MinimalReentrant``, PyTorch's
``use_reentrant=True``; ``minimal_hooks``, ``use_reentrant=False``); read them first.
Both are exact for a deterministic function that nobody modifies in place. Everything else a
real checkpoint must guard against, each a silent wrong gradient otherwise (most of them in
``torch.utils.checkpoint`` too: ``ckpt_lab/checkpoint/cases.py`` is the catalogue, with
each design's outcome), is layered on top, each guard in a module named for it, and assembled
in ``ckpt_lab.checkpoint.reentrant`` and ``ckpt_lab.checkpoint.hooks``; ``checkpoint`` below
picks one and hands it the guards of the call:

* RNG (``replay``): the generators of the CPU and of every CUDA device found in the arguments
  (nested in lists, tuples and dicts too) and in the parameters of an ``nn.Module`` function
  are replayed, so a dropout draws the same mask twice, and so is any ``torch.Generator``
  passed as an argument; a device whose generator is not replayed is refused (meta tensors,
  which hold no values, are exempt).
* autocast (``replay``): the recompute runs under the autocast settings of the forward.
* grad mode (reentrant): the full reentrant design runs its forward with grad enabled, as the
  caller does, under a pack hook that keeps nothing; code that asks ``torch.is_grad_enabled()``
  (``nn.TransformerEncoder``'s and ``nn.MultiheadAttention``'s fast paths in eval) takes the
  same branch in forward and recompute. (Under ``no_grad`` the forward took the fast path and
  the recompute the slow one: PyTorch's reentrant checkpoint is wrong there.)
* module state (``module_state``; found by ``hidden_inputs.modules_of``): the modules the function uses
  (the function itself, its ``self``, its closure, a ``partial``'s arguments, the globals it
  reads, its arguments, and modules held in lists, tuples, dicts and plain objects' attributes
  among those) have their parameters and buffers recorded when the forward starts. A buffer the
  forward changes (a ``FakeQuantize`` observer, ``spectral_norm``'s power iteration, a
  ``self.step += 1`` counter, batch norm's running statistics) is recomputed from a copy of its
  value at the start and put back afterwards, as the RNG is: the recompute sees what the
  forward saw and the module keeps one update. A parameter or buffer replaced by another object
  between forward and backward is swapped back for the recompute (plain autograd's graph also
  holds the old one); a buffer modified in place then is refused.
* versions (``guards``): plain autograd refuses a saved tensor modified in place ("modified by
  an inplace operation"); a checkpoint saves no tensor for autograd to check, so it checks by
  itself: its tensor arguments (positional, keyword, nested), the parameters of the modules
  above, every leaf tensor requiring grad that the forward's graph reaches
  (``hidden_inputs.graph_leaves``: a parameter however the function found it, e.g.
  ``partial(F.linear, weight=w)``), and every tensor the function saved, through a
  storage-less alias that shares the tensor's version counter (``guards.probe``). An optimizer
  step before backward is refused in both designs. Not seen: a captured tensor that needs no
  grad and that no operation saves; keep what the function reads unchanged until backward.
* parameters as inputs (reentrant): the graph walk also tells the reentrant node which
  parameters the function read; it takes them as inputs and differentiates its recompute with
  ``torch.autograd.grad``, so ``backward(inputs=[p])``, ``torch.autograd.grad`` and an input
  that needs no grad (a frozen embedding under LoRA) all give plain autograd's gradients.
  Arguments and outputs nested in lists, tuples and dicts are flattened
  (``torch.utils._pytree``) so each tensor in them is connected (``arguments``). A captured
  tensor with a history (a non-leaf from outside) cannot be connected: it is refused, pass it
  as an argument.
* metadata (``guards``): every recomputed saved tensor (or output) must have the forward's
  shape, dtype and device; a function that branches on global state is refused instead of
  mis-differentiated.
* fingerprint (``determinism_check="fingerprint"``, off by default; ``fingerprint``): a digest
  of every saved tensor's bits (``fingerprint.fingerprint_of``: its bytes as 64-bit integers,
  summed with wrap-around) taken in the forward and again in the recompute (reentrant: of every
  output); a difference raises ``CheckpointError`` naming the tensor and the op that made it.
  It catches what nothing above sees: a generator the function finds by itself, another thread
  drawing from the global one, state of a module the search above misses, ``p.data`` edits,
  nondeterministic kernels. Its cost, measured on ``benchmarks/bench_checkpoint.py``'s model
  (16 blocks Linear(512)-GELU-Dropout, batch 256, 4 segments; a 2-core CPU shared with other
  jobs, one thread, median of 30 paired ratios of process CPU time): +10.2% step time for
  ``impl="hooks"`` (it reads every saved tensor twice more), +1.6% for ``impl="reentrant"``
  (outputs only); on the quick size (width 128, batch 64) +23% and +11%. (Wall clock, 40
  repeats on a quieter moment: +10.6% and +2.2%.) That is about the 10% by which the benchmark
  allows ckpt_lab to trail ``torch.utils.checkpoint``, for one check among many, so it is off
  by default: ``"default"`` (PyTorch's default value) compares shapes, dtypes and devices, as
  PyTorch does, and ``"none"`` means the same here (the metadata check costs nothing and stays
  on). Every case of the catalogue is exact or refused without it.
* early stop (hooks; ``early_stop``): the recompute stops as soon as it has produced the last
  tensor backward needs (``early_stop=False`` runs the whole function again; lesson 4 measures
  the difference), at an op boundary: an op that writes into an argument it saved
  (``nn.RReLU``'s noise buffer, saved before it is filled) runs before the stop, one that only
  reads its inputs is skipped.
* nesting (hooks): a checkpoint's inputs are saved through whatever hooks are active, so a
  checkpoint inside a checkpoint frees its inputs too (what makes ``checkpoint_recursive``
  O(log L)); a ``torch.autograd.grad`` inside the function works in forward and in recompute.
* ``torch.compile``: ``checkpoint`` is excluded from Dynamo (``torch._disable_dynamo``, as
  PyTorch's own is), so a compiled function that calls it breaks its graph there and runs the
  checkpointed region eagerly, with the gradients above; the code around it is compiled (a
  call inside a loop makes Dynamo run the whole enclosing function eagerly and compile only
  the functions it calls outside the checkpoints: Dynamo cannot resume inside a loop).
  Without this Dynamo traced into the checks and backward raised a bare ``StopIteration``.
  ``benchmarks/bench_compile.py`` measures what the eager region costs against PyTorch's
  checkpoint, which Dynamo compiles as a higher-order op.

What no checkpoint can make exact (``tests/checkpoint/test_checkpoint_limits.py`` shows each; with
``determinism_check="fingerprint"`` ckpt_lab refuses them):

* a custom ``torch.Generator`` that the function reaches by itself (a global, a closure, a
  module attribute): the checkpoint cannot see it, so the recompute draws other numbers. Pass
  the generator as an argument (then it is replayed like the global ones) or create it inside
  the function from a seed argument (``torch.Generator().manual_seed(seed)``).
* the global generator shared across threads: if another thread draws from it while the
  forward runs, the forward's numbers depend on that interleaving, which the recompute does not
  see again. Give each thread its own generator, or keep random ops out of the checkpoint.
* state of a module the search above does not find (one in a global dict, or held deeper than
  one plain object): its buffers are neither replayed nor checked. Pass the module as an
  argument, or checkpoint a function bound to it.

Where ckpt_lab behaves differently from ``torch.utils.checkpoint``, on purpose:

* every row of the catalogue where torch is silently wrong: modules that change their own
  buffers (and batch norm, whose statistics torch updates twice), state changed between
  forward and backward, an optimizer step before backward, and (reentrant) grad-mode branches,
  nested outputs, ``backward(inputs=[p])``, inputs that need no grad.
* a custom ``autograd.Function`` that reads ``ctx.saved_tensors`` twice gets the same tensors
  again, without another forward (torch raises).
* an op that fills a buffer after saving it (``nn.RReLU`` in training) gets the filled buffer;
  torch's early stop hands backward the unfilled one, whatever memory held (pytorch/pytorch
  #193671), unless its early stop is turned off, a context manager:
  ``with torch.utils.checkpoint.set_checkpoint_early_stop(False): ...``.
* ``impl="reentrant"`` accepts keyword tensor arguments, tensors nested in arguments and
  outputs, ``torch.autograd.grad``, and a function that saves nothing for grad; it refuses a
  function that differentiates inside its own forward (use ``impl="hooks"``).
* no diagnostic when no output requires grad (``impl="hooks"``): then no operation inside
  saved anything through the checkpoint, which costs and changes nothing, as in a plain run.
* ``context_fn`` is accepted in both designs (torch: non-reentrant only), so a policy built
  with ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` runs unchanged;
  ``policy`` is ckpt_lab's own selective checkpointing (one or the other).
* not supported: ``debug`` and ``GraphExecGroup``; ``use_reentrant`` is ``impl``.

``torch.utils.checkpoint`` is the oracle in the tests; nothing here calls it.
"""
from __future__ import annotations

import inspect
import sys
import types

import torch
from torch import nn

from .arguments import named_leaves
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
    "debug": "not supported; run the function without checkpoint to debug it",
}
DETERMINISM_CHECKS = ("default", "none", "fingerprint")


def _contexts(context_fn, policy) -> tuple:
    """The (forward, recompute) context managers ``context_fn`` returns (None, None if none)."""
    if context_fn is None:
        return None, None
    if policy is not None:
        raise ValueError("pass policy= (ckpt_lab's selective checkpointing) or context_fn= "
                         "(PyTorch's, e.g. create_selective_checkpoint_contexts), not both.")
    if not callable(context_fn):
        raise TypeError(f"context_fn must be a callable that returns two context managers "
                        f"(forward, recompute), as torch.utils.checkpoint's does; got "
                        f"{type(context_fn).__name__}.")
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
               **kwargs):
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
    ``"fingerprint"`` also compares their bits (a digest each; costs about 10% of a step with
    ``impl="hooks"``, see the module docstring) and refuses what no other check sees.
    The names ``impl``, ``preserve_rng_state``, ``policy``, ``early_stop``, ``context_fn``,
    ``determinism_check`` and PyTorch's ``use_reentrant`` and ``debug`` belong to
    ``checkpoint``, so ``fn`` cannot receive keyword arguments with those names.
    Under ``torch.compile`` the call is a graph break: the checkpointed region runs eagerly.
    See the module docstring for what is checked and how this differs from PyTorch's.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if not callable(fn):
        raise TypeError(f"checkpoint needs a callable first argument, got {type(fn).__name__}")
    for name in _TORCH_ONLY.keys() & kwargs.keys():
        raise TypeError(f"checkpoint() got {name}=, an argument of torch.utils.checkpoint: "
                        f"{_TORCH_ONLY[name]}.")
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check must be one of {DETERMINISM_CHECKS} (as in "
                         f"torch.utils.checkpoint), got {determinism_check!r}")
    forward_context, recompute_context = _contexts(context_fn, policy)
    selective = None if policy is None else SelectiveFunction(fn, policy, error=CheckpointError)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    leaves = named_leaves(args, kwargs)
    modules = modules_of(fn, leaves)
    params = list({id(p): p for m in modules for p in m.parameters()}.values())
    tensors = [t for _, t in leaves if isinstance(t, torch.Tensor)]
    generators = [g for _, g in leaves if isinstance(g, torch.Generator)]
    guards = Guards(Replay.capture(tensors + params, generators, preserve_rng_state),
                    Versions.capture(leaves, params, modules), ModuleState(modules),
                    recompute_context, determinism_check == "fingerprint")
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
        if isinstance(segments, bool) or not isinstance(segments, int) \
                or not 1 <= segments <= num_layers:
            raise ValueError(f"segments must be an int between 1 and the number of layers "
                             f"({num_layers}), got {segments!r}")
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
