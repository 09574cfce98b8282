"""Activation checkpointing written from scratch, in the two designs PyTorch has used.

Read it top to bottom. First the two designs, each in its minimal form (about 25 lines):

1. ``MinimalReentrant`` (PyTorch's ``use_reentrant=True``): an ``autograd.Function`` runs the
   function under ``no_grad``, so nothing inside is saved, and keeps only its input. Its
   backward re-runs the function with grad enabled and back-propagates through that fresh
   graph: the autograd engine re-entered from inside itself.
2. ``minimal_hooks`` (``use_reentrant=False``): the function runs normally, but under
   ``saved_tensors_hooks`` whose pack hook lets autograd store a small handle instead of each
   tensor it wants to save. The first unpack in backward re-runs the function and hands the
   recomputed tensors to the original graph, in the order they were saved.

Both are exact for a deterministic function that nobody modifies in place. Everything else a
real checkpoint must guard against, each a silent wrong gradient otherwise, is layered on top
(section "the checks"), then assembled into ``_Reentrant`` and ``_Frame``:

* RNG: the generators of the CPU and of every CUDA device found in the arguments (nested in
  lists, tuples and dicts too) and in the parameters of an ``nn.Module`` function are replayed,
  so a dropout draws the same mask twice, and so is any ``torch.Generator`` passed as an
  argument; a device whose generator is not replayed is refused (meta tensors, which hold
  no values, are exempt).
* autocast: the recompute runs under the autocast settings of the forward.
* versions: plain autograd refuses a saved tensor modified in place ("modified by an inplace
  operation"); a checkpoint saves no tensor for autograd to check, so it checks by itself:
  its tensor arguments (positional, keyword, nested), the parameters of the modules the
  function uses (the function itself, its ``self``, its closure, a ``partial``'s arguments, the
  globals it reads), and (hooks) every tensor the function saved, through a storage-less alias
  that shares the tensor's version counter (``_probe``). Not seen: a captured tensor that is
  no parameter and that no operation saves (with the reentrant design: any captured tensor
  that is no parameter); keep what the function reads unchanged until backward.
* metadata: every recomputed saved tensor (or output) must have the forward's shape, dtype and
  device; a function that branches on global state is refused instead of mis-differentiated.
* early stop (hooks): the recompute stops as soon as it has produced the last tensor backward
  needs (``early_stop=False`` runs the whole function again; lesson 4 measures the difference),
  at an op boundary: an op that writes into an argument it saved (``nn.RReLU``'s noise buffer,
  saved before it is filled) runs before the stop, one that only reads its inputs is skipped.
* nesting (hooks): a checkpoint's inputs are saved through whatever hooks are active, so a
  checkpoint inside a checkpoint frees its inputs too (what makes ``checkpoint_recursive``
  O(log L)); a ``torch.autograd.grad`` inside the function works in forward and in recompute.

What no checkpoint can fix (``tests/test_checkpoint_limits.py`` shows each):

* a custom ``torch.Generator`` that the function reaches by itself (a global, a closure, a
  module attribute): the checkpoint cannot see it, so the recompute draws other numbers. Pass
  the generator as an argument (then it is replayed like the global ones) or create it inside
  the function from a seed argument (``torch.Generator().manual_seed(seed)``).
* the global generator shared across threads: if another thread draws from it while the
  forward runs, the forward's numbers depend on that interleaving, which the recompute does not
  see again. Give each thread its own generator, or keep random ops out of the checkpoint.
* BatchNorm in training mode updates its running statistics in the recompute a second time;
  outputs and gradients are right, the statistics move with about twice the momentum. Use
  ``ckpt_lab.models.RecomputeSafeBatchNorm2d`` or keep batch norm out of the checkpoint.

Where ckpt_lab behaves differently from ``torch.utils.checkpoint``, on purpose:

* a parameter modified in place between forward and backward (an optimizer step), or a
  saved tensor modified in place inside the function, raises ``CheckpointError`` where torch
  returns wrong gradients silently.
* a custom ``autograd.Function`` that reads ``ctx.saved_tensors`` twice gets the same tensors
  again, without another forward (torch raises).
* an op that fills a buffer after saving it (``nn.RReLU`` in training) gets the filled buffer;
  torch's early stop hands backward the unfilled one, whatever memory held (pytorch/pytorch
  #193671), unless ``torch.utils.checkpoint.set_checkpoint_early_stop(False)``.
* ``impl="reentrant"`` refuses a call where no tensor argument requires grad: torch runs it,
  but then the output has no ``grad_fn`` and every parameter inside silently gets no gradient
  (the trap of a frozen embedding or a LoRA adapter). Make the input require grad
  (``x.requires_grad_()``, what ``enable_input_require_grads`` does) or use ``impl="hooks"``.
* no diagnostic when no output requires grad (``impl="hooks"``): then no operation inside
  saved anything through the checkpoint, which costs and changes nothing, as in a plain run.
* not supported: ``context_fn`` (``policy`` plays its role), ``debug``, ``determinism_check``
  (the metadata check is always on) and ``GraphExecGroup``; ``use_reentrant`` is ``impl``.

``torch.utils.checkpoint`` is the oracle in the tests; nothing here calls it.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import sys
import types
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .memory import phase
from .selective import SelectiveFunction

IMPLS = ("hooks", "reentrant")


class CheckpointError(RuntimeError):
    """The recomputation would not reproduce the forward, so gradients would be wrong."""


# ============================================================== 1. the two designs, minimal
class MinimalReentrant(torch.autograd.Function):
    """Design 1: forward without a graph; backward re-runs ``fn`` with one and differentiates."""

    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn = fn
        ctx.save_for_backward(x)                  # the only tensor kept
        with torch.no_grad():                     # so nothing inside fn is saved
            return fn(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)       # a fresh leaf to build the graph from
        with torch.enable_grad():
            out = ctx.fn(x)                       # the recompute
        torch.autograd.backward(out, grad_out)    # parameters inside get their .grad here
        return None, x.grad


def minimal_reentrant(fn, x):
    """``fn(x)`` keeping only ``x``: the reentrant design at its smallest."""
    return MinimalReentrant.apply(fn, x)


def minimal_hooks(fn, x):
    """``fn(x)`` keeping only ``x``: the saved-tensor-hooks design at its smallest."""
    recomputed = {}                               # handle -> tensor, filled by the recompute
    count = 0

    def pack(tensor):                             # forward: autograd keeps an int instead
        nonlocal count
        count += 1
        return count - 1

    def unpack(handle):                           # backward: the first call re-runs fn
        if not recomputed:
            again = []
            with torch.autograd.graph.saved_tensors_hooks(
                    lambda t: again.append(t.detach()), lambda _: None), torch.enable_grad():
                fn(x.detach().requires_grad_(x.requires_grad))
            recomputed.update(enumerate(again))   # saved in the same order as the forward
        return recomputed.pop(handle)             # popped: freed once backward has used it

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(x)


# ========================================================================== 2. the checks
def _walk(obj, path: str, out: list):
    """Collect (path, leaf) for tensors and modules in nested lists, tuples and dicts."""
    if isinstance(obj, (torch.Tensor, nn.Module, torch.Generator)):
        out.append((path, obj))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]", out)


def _leaves(args, kwargs) -> list[tuple[str, object]]:
    """Tensors, modules and generators in the arguments, named like ``argument 0[1]``."""
    out: list = []
    for i, a in enumerate(args):
        _walk(a, f"argument {i}", out)
    for k, v in kwargs.items():
        _walk(v, f"keyword argument {k!r}", out)
    return out


def _modules_of(fn, leaves) -> list[nn.Module]:
    """Modules whose parameters ``fn`` uses: itself, its ``self``, its closure, its arguments."""
    found = [m for _, m in leaves if isinstance(m, nn.Module)]
    todo = [fn]
    while todo:
        f = todo.pop()
        if isinstance(f, nn.Module):
            found.append(f)
        elif isinstance(f, functools.partial):
            todo += [f.func, *f.args, *f.keywords.values()]
        elif inspect.ismethod(f):
            todo.append(f.__self__)
        elif isinstance(f, (list, tuple)):
            todo += [m for m in f if isinstance(m, nn.Module)]
        elif isinstance(f, types.FunctionType):
            for cell in f.__closure__ or ():
                try:
                    v = cell.cell_contents
                except ValueError:             # a cell not filled yet
                    continue
                if isinstance(v, (nn.Module, list, tuple, functools.partial, types.MethodType)):
                    todo.append(v)          # (a wrapped module's forward is a bound method)
            for name in _global_names(f.__code__):
                v = f.__globals__.get(name)
                if isinstance(v, nn.Module):
                    todo.append(v)
    return list({id(m): m for m in found}.values())


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names a function reads as globals (a notebook's model, a test's layer)."""
    return tuple({i.argval for i in dis.get_instructions(code)
                  if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")})


# ------------------------------------------------------------------------ RNG and autocast
def _cuda_devices(tensors, preserve: bool) -> list[int]:
    """CUDA devices whose generators to replay; refuses devices whose generator is not."""
    devices = set()
    for t in tensors:
        if t.is_cpu:
            continue
        kind = t.device.type
        if kind == "cuda":
            devices.add(t.get_device())
        elif kind != "meta" and preserve:
            raise CheckpointError(
                f"a tensor of the checkpointed function is on device '{kind}', whose random "
                "generator ckpt_lab does not replay (only CPU and CUDA ones): a dropout there "
                "would draw another mask in the recompute. Pass preserve_rng_state=False if "
                f"the function draws no random numbers on '{kind}'.")
    return sorted(devices)


@functools.lru_cache(maxsize=1)
def _autocast_devices() -> tuple[str, ...]:
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


@dataclass
class _Replay:
    """What the recompute must see again: the random generators and the autocast settings."""

    cpu_rng: torch.Tensor | None
    cuda_devices: list[int]
    cuda_rng: list[torch.Tensor]
    autocast: list[tuple[str, bool, torch.dtype]]
    generators: list[tuple[torch.Generator, torch.Tensor]]   # those passed as arguments

    @staticmethod
    def capture(tensors, generators, preserve_rng_state: bool) -> "_Replay":
        autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                    for d in _autocast_devices()]
        devices = _cuda_devices(tensors, preserve_rng_state)
        if not preserve_rng_state:
            return _Replay(None, [], [], autocast, [])
        return _Replay(torch.get_rng_state(), devices,
                       [torch.cuda.get_rng_state(d) for d in devices], autocast,
                       [(g, g.get_state()) for g in generators])

    @contextlib.contextmanager
    def restored(self):
        """Run the block as the forward ran; put the current generator states back after."""
        with contextlib.ExitStack() as stack:
            if self.cpu_rng is not None:
                stack.enter_context(torch.random.fork_rng(devices=self.cuda_devices))
                torch.set_rng_state(self.cpu_rng)
                for d, s in zip(self.cuda_devices, self.cuda_rng):
                    torch.cuda.set_rng_state(s, d)
                for g, s in self.generators:      # put back after the block, like fork_rng
                    stack.callback(g.set_state, g.get_state())
                    g.set_state(s)
            for device, enabled, dtype in self.autocast:
                stack.enter_context(torch.autocast(device_type=device, enabled=enabled,
                                                   dtype=dtype))
            yield


# -------------------------------------------------------------------------------- versions
_EMPTY: dict[torch.device, torch.Tensor] = {}


def _probe(t: torch.Tensor) -> torch.Tensor | None:
    """A storage-less alias of ``t`` that shares its version counter: sees in-place edits of
    ``t`` (and of its views and base) without keeping its memory alive."""
    try:
        alias = t.detach()
        empty = _EMPTY.get(t.device)
        if empty is None:
            empty = _EMPTY[t.device] = torch.empty(0, device=t.device)
        alias.data = empty                    # drops the storage, keeps the version counter
        return alias
    except (RuntimeError, TypeError):         # inference tensors, exotic subclasses
        return None


@dataclass
class _Versions:
    """The version of each tensor argument and module parameter when the forward began."""

    inputs: list[tuple[str, weakref.ref, int]]
    params: list[tuple[nn.Parameter, int]]
    modules: list[nn.Module]

    @staticmethod
    def capture(leaves, params, modules) -> "_Versions":
        return _Versions([(name, weakref.ref(t), t._version) for name, t in leaves
                          if isinstance(t, torch.Tensor)],
                         [(p, p._version) for p in params], modules)

    def check(self):
        """Refuse if an argument or a parameter was modified in place since the forward."""
        for name, ref, version in self.inputs:
            t = ref()
            if t is not None and t._version != version:
                raise CheckpointError(
                    f"{name} of the checkpointed function {_describe(t)} was modified in "
                    "place after it was passed in (inside the function or before backward); "
                    "the recompute would start from other values and give wrong gradients. "
                    "Clone it first (x = x.clone()) or make the in-place operation "
                    "out-of-place.")
        for p, version in self.params:
            if p._version != version:
                raise CheckpointError(
                    f"{self._name(p)} was modified in place between the forward and the "
                    "backward (an optimizer step or a weight update before loss.backward()?); "
                    "the recompute would use the new values and give the gradients of a "
                    "network that never ran. Call backward before changing the weights.")

    def _name(self, p) -> str:
        for m in self.modules:
            for name, q in m.named_parameters():
                if q is p:
                    return f"parameter '{name}' of {type(m).__name__}"
        return "a parameter"


def _describe(t: torch.Tensor) -> str:
    return f"({tuple(t.shape)}, {str(t.dtype).replace('torch.', '')})"


def _modified_saved_tensor(i: int, shape, dtype, now: int, then: int) -> CheckpointError:
    return CheckpointError(
        f"tensor {i} that the checkpointed function saved for backward ({tuple(shape)}, "
        f"{str(dtype).replace('torch.', '')}) was modified in place after it was saved (now at "
        f"version {now}, saved at {then}): plain autograd refuses this too ('modified by an "
        "inplace operation'). If it is an intermediate result, make the in-place operation "
        "out-of-place (y = y * 3, not y.mul_(3)); if it is a parameter or a captured tensor, "
        "do not change it between the forward and the backward.")


# ------------------------------------------------------------------------------- metadata
def _meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.dtype, t.device)


def _mismatch(what: str, forward: tuple, recompute: tuple) -> CheckpointError:
    def show(m):
        return f"shape {tuple(m[0])}, dtype {str(m[1]).replace('torch.', '')}, device {m[2]}"
    return CheckpointError(
        f"{what} had {show(forward)} in the forward but {show(recompute)} in the recompute; "
        "the checkpointed function must run the same operations both times (no branching on "
        "global state or on a call counter).")


def _fresh(t):
    """The recompute's copy of an input: a new leaf if it requires grad, else ``t`` itself."""
    if isinstance(t, torch.Tensor) and t.requires_grad:
        return t.detach().requires_grad_(True)
    return t


# ================================================================ 3. the two designs, full
_TENSOR = object()   # marks an argument slot that the saved tensors fill


class _Reentrant(torch.autograd.Function):
    """``MinimalReentrant`` plus the checks: any positional arguments, RNG, versions, metadata."""

    @staticmethod
    def forward(ctx, fn, replay, versions, *args):
        ctx.fn, ctx.replay, ctx.versions = fn, replay, versions
        ctx.slots = [_TENSOR if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        with torch.no_grad():
            out = fn(*args)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        ctx.out_meta = [_meta(o) if isinstance(o, torch.Tensor) else None for o in outs]
        return out

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise CheckpointError(
                "impl='reentrant' works only with .backward() without `inputs`; for "
                "torch.autograd.grad or backward(inputs=...) use impl='hooks'.")
        ctx.versions.check()
        saved = iter(ctx.saved_tensors)
        args = [_fresh(next(saved)) if s is _TENSOR else s for s in ctx.slots]
        with ctx.replay.restored(), torch.enable_grad(), phase("recompute"):
            out = ctx.fn(*args)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        for k, (o, m) in enumerate(zip(outs, ctx.out_meta)):
            if m is not None and _meta(o) != m:
                raise _mismatch(f"impl='reentrant': output {k}", m, _meta(o))
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            try:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            except RuntimeError as e:
                if "modified by an inplace operation" not in str(e):
                    raise
                raise CheckpointError(
                    "impl='reentrant': inside the checkpointed function a tensor saved for "
                    "backward was modified in place after it was saved (autograd's message "
                    "below names it). Make that in-place operation out-of-place (y = y * 3, "
                    "not y.mul_(3)) or clone the tensor before modifying it.") from e
        in_grads = [a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None
                    for a in args]
        return (None, None, None, *in_grads)


class _Holder:
    """What autograd stores in place of a saved tensor: filled by a recompute."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self):
        self.tensor = None


class _Saved:
    """What the forward recorded about one saved tensor: its holder, metadata and version."""

    __slots__ = ("holder", "meta", "requires_grad", "probe", "version")

    def __init__(self, holder: _Holder, t: torch.Tensor):
        self.holder = weakref.ref(holder)         # dead once autograd no longer needs it
        self.meta, self.requires_grad = _meta(t), t.requires_grad
        self.probe, self.version = _probe(t), t._version

    def edited(self) -> bool:
        """Modified in place since it was saved, while autograd still needs it."""
        return (self.probe is not None and self.probe._version != self.version
                and self.holder() is not None)


_CUSTOM_NODE = torch.autograd.function.BackwardCFunction


class _StopRecompute(Exception):
    """Raised once the recompute has produced every tensor backward needs (early stop)."""


_WRITES: dict = {}


def _writes(func) -> bool:
    """Whether an ATen op writes into one of its arguments (its schema marks it ``(a!)``)."""
    hit = _WRITES.get(func)
    if hit is None:
        hit = _WRITES[func] = any(a.alias_info is not None and a.alias_info.is_write
                                  for a in func._schema.arguments)
    return hit


# The last _WATCHED saved tensors decide how a recompute stops early: a matmul, the usual last
# op, saves two inputs. If they all require grad it stops at the last save; otherwise a
# _StopAtOp starts watching there (the op in flight when it starts is one it cannot see).
_WATCHED = 2


class _StopAtOp(TorchDispatchMode):
    """Ends an early-stopping recompute at an op boundary once every tensor has been saved.

    Autograd saves an op's inputs *before* the op runs. Stopping right there is exact for an
    op that only reads them (the last ``softmax . V`` of an attention core is skipped), but not
    for one that writes into an argument it saves: ``rrelu_with_noise`` saves its ``noise``
    buffer and only then fills it, so stopping before it hands backward an uninitialised
    buffer (PyTorch's own non-reentrant checkpoint does, pytorch/pytorch#193671). Such an op
    runs first.

    A tensor an op writes after saving it is one of its buffer arguments (rrelu's noise, batch
    norm's running statistics), which never require grad. So the stopper is needed only when
    one of the last saved tensors does not require grad; otherwise (a matmul's two inputs,
    the usual end of a block) the recompute stops at the last save itself, at no cost.

    A mode started while an op is in flight does not see that op, only the ops its kernel
    calls; stopping at one of those would cut the op short. So when nothing has been seen
    since a mid-op start, the last saved tensor may be that op's, and the recompute is not
    stopped (it runs to the end, which is exact).
    """

    def __init__(self):
        super().__init__()
        self.active = False        # entered (it starts late, or not at all)
        self.mid_op = False        # entered from a pack hook, while an op was in flight
        self.pending = False       # the last saved tensor has been packed: stop at the next op
        self.seen = 0              # ops seen, those of the recompute's own pack hook aside
        self.quiet = False         # inside the pack hook

    def start(self, mid_op: bool):
        """Enter the mode (once)."""
        if not self.active:
            self.__enter__()
            self.active, self.mid_op = True, mid_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.quiet:
            return func(*args, **(kwargs or {}))
        self.seen += 1
        if self.pending and not _writes(func):
            raise _StopRecompute
        out = func(*args, **(kwargs or {}))
        if self.pending:
            raise _StopRecompute
        return out


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

    def __init__(self, fn, args, kwargs, replay, versions, early_stop):
        self.fn, self.replay, self.versions, self.early_stop = fn, replay, versions, early_stop
        self.num_args, self.keys = len(args), list(kwargs)
        values = list(args) + list(kwargs.values())
        self.slots = [_TENSOR if isinstance(v, torch.Tensor) else v for v in values]
        dummy = torch.empty(0, requires_grad=True)
        # Keep the (empty) output: it owns the autograd node, and some PyTorch versions (2.11)
        # free a custom Function's saved tensors once its node has no owner left.
        self.saver_out = _SaveInputs.apply(
            dummy, *[v for v in values if isinstance(v, torch.Tensor)])
        self.saver = self.saver_out.grad_fn
        self.saved: list[_Saved] = []
        self.running = True                       # the forward has not returned yet

    def pack(self, t: torch.Tensor) -> _Holder:
        h = _Holder()
        self.saved.append(_Saved(h, t))
        return h

    def unpack(self, h: _Holder) -> torch.Tensor:
        if h.tensor is None:
            self.recompute()
        t = h.tensor
        # A custom autograd.Function may read ctx.saved_tensors twice: keep its tensors until
        # its node releases them (or this backward ends). Built-in nodes read once: let go now.
        if not isinstance(torch._C._current_autograd_node(), _CUSTOM_NODE):
            h.tensor = None
        return t

    def _check_versions(self):
        self.versions.check()
        for i, s in enumerate(self.saved):
            if s.edited():
                raise _modified_saved_tensor(i, s.meta[0], s.meta[1], s.probe._version,
                                             s.version)

    def inputs(self):
        saved = iter(self.saver.saved_tensors)
        values = [_fresh(next(saved)) if s is _TENSOR else s for s in self.slots]
        n = self.num_args
        return values[:n], dict(zip(self.keys, values[n:]))

    def recompute(self):
        """Re-run the function, filling every live holder in save order."""
        self._check_versions()
        args, kwargs = self.inputs()
        n = len(self.saved)                       # during the forward: those saved so far
        stop = self.early_stop or self.running
        count = 0

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
            if _meta(x) != entry.meta:
                raise _mismatch(f"impl='hooks': saved tensor {i}", entry.meta, _meta(x))
            stopper.quiet = True
            x = x.detach() if x.requires_grad else x   # (x itself would hold its own grad_fn)
            stopper.quiet = False
            h = entry.holder()
            if h is not None:
                h.tensor = x
            if stop and count == n:
                if at_save:
                    raise _StopRecompute
                # the op in flight will be seen, unless the stopper started during it
                stopper.pending = stopper.active and (not stopper.mid_op or stopper.seen > 0)
            elif stop and not at_save and count >= n - _WATCHED:
                watch(mid_op=True)
            return x                              # the recompute's own graph stays usable

        # The stopper (a dispatch mode: a Python call per op) watches only the ops from the
        # _WATCHED-th last saved tensor on. It is not started from inside a backward the
        # function runs itself (torch.autograd.grad), whose engine keeps its own dispatch
        # state; the recompute then just runs to the end.
        stopper, task = _StopAtOp(), torch._C._current_graph_task_id()
        at_save = all(e.requires_grad for e in self.saved[max(n - _WATCHED, 0):n])

        def watch(mid_op):
            if torch._C._current_graph_task_id() == task:
                stopper.start(mid_op)

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), \
                self.replay.restored(), torch.enable_grad(), phase("recompute"):
            try:
                if stop and not at_save and n <= _WATCHED:
                    watch(mid_op=False)
                self.fn(*args, **kwargs)
            except _StopRecompute:
                pass
            finally:
                if stopper.active:
                    stopper.__exit__(None, None, None)
        if count < n:
            raise CheckpointError(
                f"impl='hooks': the recompute saved {count} tensors but the forward saved "
                f"{n}; the checkpointed function must run the same operations both times.")
        for s in self.saved:                      # in-place updates the recompute itself made
            if s.probe is not None:               # (batch-norm statistics) are not edits
                s.version = s.probe._version
        if torch._C._current_graph_task_id() != -1:
            # Free, when this backward ends, what it recomputed but did not use up (tensors
            # kept for a custom Function, backward(inputs=...) on part of the graph).
            # (Not a method of the frame: that would keep its inputs alive until then.)
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(_clear, self.saved))


def _clear(saved: list):
    """Empty the holders a recompute filled and backward did not use."""
    for s in saved:
        h = s.holder()
        if h is not None:
            h.tensor = None


def _checkpoint_hooks(fn, args, kwargs, replay, versions, early_stop):
    frame = _Frame(fn, args, kwargs, replay, versions, early_stop)
    try:
        with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
            return fn(*args, **kwargs)
    finally:
        frame.running = False


# =========================================================================== 4. the API
_TORCH_ONLY = {
    "use_reentrant": "ckpt_lab calls it impl: impl='reentrant' or impl='hooks'",
    "context_fn": "selective checkpointing is policy=... here (see ckpt_lab.selective)",
    "determinism_check": "the shape/dtype check of every recomputed tensor is always on",
    "debug": "not supported; run the function without checkpoint to debug it",
}


def checkpoint(fn, *args, impl: str = "hooks", preserve_rng_state: bool = True, policy=None,
               early_stop: bool = True, **kwargs):
    """Run ``fn(*args, **kwargs)`` keeping only its inputs; recompute the rest in backward.

    ``impl`` picks the design (``"hooks"``, the default, or ``"reentrant"``).
    ``preserve_rng_state`` replays the random generators so dropout draws the same mask.
    ``policy`` (selective checkpointing, see ``ckpt_lab.selective``) keeps the outputs of the
    operations it chooses instead of recomputing them: a callable ``policy(op, *args,
    **kwargs) -> bool``, a collection of ATen ops, or a name such as ``"save_matmuls"``.
    ``early_stop`` (hooks only) ends the recompute as soon as backward has every tensor it
    needs; the reentrant design always re-runs all of ``fn``, since it needs its outputs.
    The names ``impl``, ``preserve_rng_state``, ``policy``, ``early_stop`` and PyTorch's
    ``use_reentrant``, ``context_fn``, ``determinism_check``, ``debug`` belong to
    ``checkpoint``, so ``fn`` cannot receive keyword arguments with those names.
    See the module docstring for what is checked and how this differs from PyTorch's.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if not callable(fn):
        raise TypeError(f"checkpoint needs a callable first argument, got {type(fn).__name__}")
    for name in _TORCH_ONLY.keys() & kwargs.keys():
        raise TypeError(f"checkpoint() got {name}=, an argument of torch.utils.checkpoint: "
                        f"{_TORCH_ONLY[name]}.")
    selective = None if policy is None else SelectiveFunction(fn, policy, error=CheckpointError)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    leaves = _leaves(args, kwargs)
    modules = _modules_of(fn, leaves)
    params = list({id(p): p for m in modules for p in m.parameters()}.values())
    tensors = [t for _, t in leaves if isinstance(t, torch.Tensor)]
    generators = [g for _, g in leaves if isinstance(g, torch.Generator)]
    replay = _Replay.capture(tensors + params, generators, preserve_rng_state)
    versions = _Versions.capture(leaves, params, modules)
    fn = fn if selective is None else selective
    if impl == "hooks":
        return _checkpoint_hooks(fn, args, kwargs, replay, versions, early_stop)
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        raise ValueError("impl='reentrant' cannot take tensors as keyword arguments (they "
                         "would get no gradient); pass them positionally or use "
                         "impl='hooks'.")
    nested = [name for name, t in leaves
              if "[" in name and isinstance(t, torch.Tensor) and t.requires_grad]
    if nested:
        raise ValueError(f"impl='reentrant' gives gradients only to tensors passed directly; "
                         f"{nested[0]} sits in a list, tuple or dict and would get none. Pass "
                         "it as a separate argument or use impl='hooks'.")
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise ValueError(
            "impl='reentrant' needs at least one tensor argument with requires_grad=True; "
            "without one the output has no grad_fn and parameters inside get no gradient "
            "(torch.utils.checkpoint runs it and they silently stay None). Call "
            "x.requires_grad_() on the input, use impl='hooks', or run under torch.no_grad() "
            "if nothing inside needs a gradient.")
    if kwargs:
        fn = functools.partial(fn, **kwargs)
    return _Reentrant.apply(fn, replay, versions, *args)


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
                          early_stop: bool = True):
    """Run ``layers`` on ``x`` in segments; every segment but the last is checkpointed.

    The last segment runs normally, as in ``torch.utils.checkpoint.checkpoint_sequential``:
    backward starts there and needs all its activations at once, so recomputing it would free
    nothing at the peak and cost one more forward of it. ``policy`` and ``early_stop`` are
    passed to ``checkpoint``.
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
                       early_stop=early_stop)
    return x


def _keeping_input(layers, a: int, b: int):
    """``run_in_order(layers[a:b])`` that refuses, in the forward, a layer writing the segment's
    input in place (``nn.ReLU(inplace=True)`` first, or after layers returning views of it):
    the checkpoint keeps that input to run the segment again, which would start from the
    overwritten values (the checkpoint's own check would say so only in backward)."""
    def run(x):
        version, h = x._version, x
        for j in range(a, b):
            h = layers[j](h)
            if x._version != version:
                fix = (f"Start that segment at layer {j + 1} instead" if a > 0 else
                       "The first segment keeps the chain's own input, so no plan but "
                       "boundaries=[0] (no checkpoint) can run this chain as it is")
                raise ValueError(
                    f"checkpoint_sequential: layer {j} ({layers[j]!r}) writes the input of the "
                    f"checkpointed segment starting at layer {a} in place; the checkpoint keeps "
                    "that input to run the segment again in backward, and would run it on the "
                    f"overwritten values. {fix}, or make the layer out of place "
                    "(inplace=False). planner.plan_chain never starts a segment there.")
        return h
    return run


# ``ckpt_lab.checkpoint`` is this module (``import ckpt_lab.checkpoint`` gives it), and calling
# it calls the function, so ``from ckpt_lab import checkpoint; checkpoint(fn, x)`` works too.
class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return checkpoint(*args, **kwargs)


__signature__ = inspect.signature(checkpoint)
sys.modules[__name__].__class__ = _CallableModule
