"""Activation checkpointing written from scratch, in the two designs PyTorch has used.

* ``impl="reentrant"``: a ``torch.autograd.Function`` runs the function under ``no_grad`` (so
  nothing inside is saved), keeps only its inputs, and in its backward re-runs the function
  with grad enabled and back-propagates through that fresh graph.
* ``impl="hooks"``: the function runs normally, but under ``saved_tensors_hooks`` whose pack
  hook stores a small handle instead of each tensor autograd wants to save. The first unpack
  in backward re-runs the function and hands the recomputed tensors to the original graph, in
  the order they were saved. Autograd itself is untouched, so ``torch.autograd.grad``,
  inputs without ``requires_grad``, keyword arguments and nesting all work.

Both replay the CPU and CUDA random number generators, so dropout draws the same mask twice,
and both refuse loudly when the recomputation does not reproduce the forward.
``torch.utils.checkpoint`` is the oracle in the tests; nothing here calls it.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from .memory import phase
from .selective import SelectiveFunction

IMPLS = ("hooks", "reentrant")


class CheckpointError(RuntimeError):
    """The recomputation did not reproduce what the forward saved, or inputs changed under it."""


# ---------------------------------------------------------------- state to replay in recompute
@dataclass
class _RngState:
    cpu: torch.Tensor | None
    cuda_devices: list[int]
    cuda: list[torch.Tensor]

    @staticmethod
    def capture(tensors, preserve: bool) -> "_RngState":
        if not preserve:
            return _RngState(None, [], [])
        devices = sorted({t.get_device() for t in tensors if t.is_cuda})
        return _RngState(torch.get_rng_state(), devices,
                         [torch.cuda.get_rng_state(d) for d in devices])

    @contextlib.contextmanager
    def restored(self):
        """Run the block with the captured generator states, then put the current ones back."""
        if self.cpu is None:
            yield
            return
        with torch.random.fork_rng(devices=self.cuda_devices):
            torch.set_rng_state(self.cpu)
            for d, s in zip(self.cuda_devices, self.cuda):
                torch.cuda.set_rng_state(s, d)
            yield


def _autocast_devices() -> tuple[str, ...]:
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def _capture_autocast() -> list[tuple[str, bool, torch.dtype]]:
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
            for d in _autocast_devices()]


@contextlib.contextmanager
def _autocast_as(state):
    """Re-enter the autocast settings that were active during the forward."""
    with contextlib.ExitStack() as stack:
        for device, enabled, dtype in state:
            stack.enter_context(torch.autocast(device_type=device, enabled=enabled, dtype=dtype))
        yield


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, t.device)


def _detach_like(a):
    """A fresh leaf with the same data and the same requires_grad, so recompute saves alike."""
    if isinstance(a, torch.Tensor):
        return a.detach().requires_grad_(a.requires_grad)
    return a


def _check_versions(refs, what: str):
    for i, ref, version in refs:
        t = ref()
        if t is not None and t._version != version:
            raise CheckpointError(
                f"{what}: tensor argument {i} of the checkpointed function was modified in place "
                "after it was passed in (inside the function or before backward). The recompute "
                "would start from different values and give wrong gradients. Clone it first "
                "(x = x.clone()) or make the in-place operation out-of-place.")


def _version_refs(args):
    return [(i, weakref.ref(a), a._version) for i, a in enumerate(args)
            if isinstance(a, torch.Tensor)]


# ---------------------------------------------------------------------------- reentrant design
class _ReentrantCheckpoint(torch.autograd.Function):
    """Forward without a graph; backward recomputes with one and differentiates through it."""

    @staticmethod
    def forward(ctx, fn, preserve_rng_state, *args):
        ctx.fn = fn
        ctx.rng = _RngState.capture([a for a in args if isinstance(a, torch.Tensor)],
                                    preserve_rng_state)
        ctx.autocast = _capture_autocast()
        ctx.slots = [i if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
        ctx.tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.versions = _version_refs(args)
        ctx.save_for_backward(*[args[i] for i in ctx.tensor_at])
        with torch.no_grad():
            out = fn(*args)
        single = isinstance(out, torch.Tensor)
        outs = (out,) if single else tuple(out)
        ctx.single = single
        ctx.out_meta = [_meta(o) if isinstance(o, torch.Tensor) else None for o in outs]
        return out

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise CheckpointError(
                "impl='reentrant' works only with .backward() without `inputs`; for "
                "torch.autograd.grad or backward(inputs=...) use impl='hooks'.")
        _check_versions(ctx.versions, "impl='reentrant'")
        saved = ctx.saved_tensors
        args = list(ctx.slots)
        for i, t in zip(ctx.tensor_at, saved):
            args[i] = _detach_like(t)
        with ctx.rng.restored(), _autocast_as(ctx.autocast), torch.enable_grad(), \
                phase("recompute"):
            out = ctx.fn(*args)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        for k, (o, m) in enumerate(zip(outs, ctx.out_meta)):
            if m is not None and _meta(o) != m:
                raise CheckpointError(
                    f"impl='reentrant': output {k} was {m[:2]} in the forward but {_meta(o)[:2]} "
                    "when recomputed; the checkpointed function must be deterministic in shape "
                    "and dtype.")
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        in_grads = [a.grad if isinstance(a, torch.Tensor) else None for a in args]
        return (None, None, *in_grads)


def _checkpoint_reentrant(fn, args, preserve_rng_state):
    if torch.is_grad_enabled() and not any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise ValueError(
            "impl='reentrant' needs at least one tensor argument with requires_grad=True; "
            "without one the output has no grad_fn and parameters inside get no gradient. "
            "Call x.requires_grad_() on the input or use impl='hooks'.")
    return _ReentrantCheckpoint.apply(fn, preserve_rng_state, *args)


# -------------------------------------------------------------------------- saved-tensor hooks
class _Holder:
    """What autograd stores in place of a saved tensor: filled by the recompute, emptied on use."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self):
        self.tensor = None


class _StopRecompute(Exception):
    """Raised once the recompute has produced every tensor the forward saved."""


class _SaveInputs(torch.autograd.Function):
    """Saves the checkpoint's inputs through whatever saved-tensor hooks are active.

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
    """Everything one hooks-checkpoint call needs to replay its function."""

    def __init__(self, fn, args, kwargs, preserve_rng_state):
        self.fn, self.kwargs = fn, kwargs
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        self.slots = [None if isinstance(a, torch.Tensor) else a for a in args]
        self.requires_grad = [a.requires_grad if isinstance(a, torch.Tensor) else None
                              for a in args]
        self.rng = _RngState.capture(tensors, preserve_rng_state)
        self.autocast = _capture_autocast()
        self.versions = _version_refs(args)
        dummy = torch.empty(0, requires_grad=True)
        # Keep the (empty) output: it owns the autograd node, and some PyTorch versions (2.11)
        # free a custom Function's saved tensors once its node has no owner left.
        self.saver_out = _SaveInputs.apply(dummy, *tensors)
        self.saver = self.saver_out.grad_fn
        self.holders: list[weakref.ref] = []
        self.metas: list[tuple] = []

    def pack(self, x: torch.Tensor) -> _Holder:
        h = _Holder()
        self.holders.append(weakref.ref(h))
        self.metas.append(_meta(x))
        return h

    def unpack(self, h: _Holder) -> torch.Tensor:
        if h.tensor is None:
            self.recompute()
        t, h.tensor = h.tensor, None
        return t

    def inputs(self) -> list:
        _check_versions(self.versions, "impl='hooks'")
        saved = iter(self.saver.saved_tensors)
        return [_detach_like(next(saved)) if s is None and rg is not None else s
                for s, rg in zip(self.slots, self.requires_grad)]

    def recompute(self):
        """Re-run the function, filling every still-needed holder in save order."""
        args = self.inputs()
        count = 0

        def pack(x):
            nonlocal count
            i = count
            count += 1
            if i >= len(self.holders):
                raise CheckpointError(
                    "impl='hooks': the recompute saved more tensors than the forward did; the "
                    "checkpointed function must run the same operations both times.")
            if _meta(x) != self.metas[i]:
                raise CheckpointError(
                    f"impl='hooks': saved tensor {i} was {self.metas[i][:2]} in the forward but "
                    f"{_meta(x)[:2]} in the recompute; the function must be deterministic in "
                    "shape and dtype (no branching on global state).")
            h = self.holders[i]()
            if h is not None:
                h.tensor = x.detach() if x.requires_grad else x
            if count == len(self.holders):
                raise _StopRecompute
            return None

        with torch.autograd.graph.saved_tensors_hooks(pack, _unreachable), \
                self.rng.restored(), _autocast_as(self.autocast), torch.enable_grad(), \
                phase("recompute"):
            try:
                self.fn(*args, **self.kwargs)
            except _StopRecompute:
                pass
        if count < len(self.holders):
            raise CheckpointError(
                f"impl='hooks': the recompute saved {count} tensors but the forward saved "
                f"{len(self.holders)}; the checkpointed function must run the same operations "
                "both times.")


def _checkpoint_hooks(fn, args, kwargs, preserve_rng_state):
    frame = _Frame(fn, args, kwargs, preserve_rng_state)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return fn(*args, **kwargs)


# ------------------------------------------------------------------------------- public API
def checkpoint(fn, *args, impl: str = "hooks", preserve_rng_state: bool = True, policy=None,
               **kwargs):
    """Run ``fn(*args, **kwargs)`` keeping only its inputs; recompute the rest in backward.

    ``policy`` (selective checkpointing, see ``ckpt_lab.selective``) keeps the outputs of the
    operations it chooses instead of recomputing them: a callable ``policy(op, *args,
    **kwargs) -> bool``, a collection of ATen ops, or a name such as ``"save_matmuls"``.
    The names ``impl``, ``preserve_rng_state`` and ``policy`` belong to ``checkpoint``, so
    ``fn`` cannot receive keyword arguments with those names.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if not callable(fn):
        raise TypeError(f"checkpoint needs a callable first argument, got {type(fn).__name__}")
    if policy is not None:
        fn = SelectiveFunction(fn, policy, error=CheckpointError)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs) if policy is None else fn.fn(*args, **kwargs)
    if impl == "reentrant":
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise ValueError("impl='reentrant' cannot take tensors as keyword arguments (they "
                             "would get no gradient); pass them positionally or use "
                             "impl='hooks'.")
        if kwargs:
            fn = _bind(fn, kwargs)
        return _checkpoint_reentrant(fn, args, preserve_rng_state)
    return _checkpoint_hooks(fn, args, kwargs, preserve_rng_state)


def _bind(fn, kwargs):
    def bound(*a):
        return fn(*a, **kwargs)
    return bound


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
                          preserve_rng_state: bool = True, policy=None):
    """Run ``layers`` on ``x`` in segments; every segment but the last is checkpointed.

    The last segment runs normally, as in ``torch.utils.checkpoint.checkpoint_sequential``:
    backward starts there and needs all its activations at once, so recomputing it would free
    nothing at the peak and cost one more forward of it. ``policy`` is passed to ``checkpoint``.
    """
    layers = layer_list(layers)
    starts = segment_starts(len(layers), segments, boundaries)
    ends = starts[1:] + [len(layers)]
    for k, (a, b) in enumerate(zip(starts, ends)):
        run = run_in_order(layers[a:b])
        last = k == len(starts) - 1
        x = run(x) if last else checkpoint(run, x, impl=impl, policy=policy,
                                           preserve_rng_state=preserve_rng_state)
    return x


def _unreachable(_):
    raise CheckpointError("the graph built during a recompute cannot be differentiated; "
                          "call backward on the original output instead")
