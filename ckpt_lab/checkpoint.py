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
real checkpoint must guard against, each a silent wrong gradient otherwise (most of them in
``torch.utils.checkpoint`` too: ``ckpt_lab/lessons/correctness.py`` is the catalogue, with
each design's outcome), is layered on top (section "the checks"), then assembled into
``_checkpoint_reentrant`` and ``_Frame``:

* RNG: the generators of the CPU and of every CUDA device found in the arguments (nested in
  lists, tuples and dicts too) and in the parameters of an ``nn.Module`` function are replayed,
  so a dropout draws the same mask twice, and so is any ``torch.Generator`` passed as an
  argument; a device whose generator is not replayed is refused (meta tensors, which hold
  no values, are exempt).
* autocast: the recompute runs under the autocast settings of the forward.
* grad mode (reentrant): the full reentrant design runs its forward with grad enabled, as the
  caller does, under a pack hook that keeps nothing; code that asks ``torch.is_grad_enabled()``
  (``nn.TransformerEncoder``'s and ``nn.MultiheadAttention``'s fast paths in eval) takes the
  same branch in forward and recompute. (Under ``no_grad`` the forward took the fast path and
  the recompute the slow one: PyTorch's reentrant checkpoint is wrong there.)
* module state (``ckpt_lab.module_state``): the modules the function uses (the function
  itself, its ``self``, its closure, a ``partial``'s arguments, the globals it reads, its
  arguments, and modules held in lists, tuples, dicts and plain objects' attributes among
  those) have their parameters and buffers recorded when the forward starts. A buffer the
  forward changes (a ``FakeQuantize`` observer, ``spectral_norm``'s power iteration, a
  ``self.step += 1`` counter, batch norm's running statistics) is recomputed from a copy of
  its value at the start and put back afterwards, as the RNG is: the recompute sees what the
  forward saw and the module keeps one update. A parameter or buffer replaced by another
  object between forward and backward is swapped back for the recompute (plain autograd's
  graph also holds the old one); a buffer modified in place then is refused.
* versions: plain autograd refuses a saved tensor modified in place ("modified by an inplace
  operation"); a checkpoint saves no tensor for autograd to check, so it checks by itself:
  its tensor arguments (positional, keyword, nested), the parameters of the modules above,
  every leaf tensor requiring grad that the forward's graph reaches (``_graph_leaves``: a
  parameter however the function found it, e.g. ``partial(F.linear, weight=w)``), and every
  tensor the function saved, through a storage-less alias that shares the tensor's version
  counter (``_probe``). An optimizer step before backward is refused in both designs. Not
  seen: a captured tensor that needs no grad and that no operation saves; keep what the
  function reads unchanged until backward.
* parameters as inputs (reentrant): the graph walk also tells the reentrant node which
  parameters the function read; it takes them as inputs and differentiates its recompute with
  ``torch.autograd.grad``, so ``backward(inputs=[p])``, ``torch.autograd.grad`` and an input
  that needs no grad (a frozen embedding under LoRA) all give plain autograd's gradients.
  Arguments and outputs nested in lists, tuples and dicts are flattened (``torch.utils._pytree``)
  so each tensor in them is connected. A captured tensor with a history (a non-leaf from
  outside) cannot be connected: it is refused, pass it as an argument.
* metadata: every recomputed saved tensor (or output) must have the forward's shape, dtype and
  device; a function that branches on global state is refused instead of mis-differentiated.
* fingerprint (``determinism_check="fingerprint"``, off by default): a digest of every saved
  tensor's bits (``_fingerprint``: its bytes as 64-bit integers, summed with wrap-around) taken
  in the forward and again in the recompute (reentrant: of every output); a difference raises
  ``CheckpointError`` naming the tensor and the op that made it. It catches what nothing above
  sees: a generator the function finds by itself, another thread drawing from the global one,
  state of a module the search above misses, ``p.data`` edits, nondeterministic kernels. Its
  cost, measured on ``benchmarks/bench_checkpoint.py``'s model (16 blocks
  Linear(512)-GELU-Dropout, batch 256, 4 segments; a 2-core CPU shared with other jobs, one
  thread, median of 30 paired ratios of process CPU time): +10.2% step time for
  ``impl="hooks"`` (it reads every saved tensor twice more), +1.6% for ``impl="reentrant"``
  (outputs only); on the quick size (width 128, batch 64) +23% and +11%. (Wall clock, 40
  repeats on a quieter moment: +10.6% and +2.2%.) That is about the 10% by which the
  benchmark allows ckpt_lab to trail ``torch.utils.checkpoint``, for one check among many,
  so it is off by default: ``"default"`` (PyTorch's default value) compares shapes, dtypes and
  devices, as PyTorch does, and ``"none"`` means the same here (the metadata check costs
  nothing and stays on). Every case of the catalogue is exact or refused without it.
* early stop (hooks): the recompute stops as soon as it has produced the last tensor backward
  needs (``early_stop=False`` runs the whole function again; lesson 4 measures the difference),
  at an op boundary: an op that writes into an argument it saved (``nn.RReLU``'s noise buffer,
  saved before it is filled) runs before the stop, one that only reads its inputs is skipped.
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

What no checkpoint can make exact (``tests/test_checkpoint_limits.py`` shows each; with
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
from torch.utils._pytree import tree_flatten, tree_unflatten

from .memory import phase
from .module_state import ModuleState, saw_saved
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


_CONTAINERS = (nn.Module, list, tuple, dict, functools.partial, types.MethodType,
               types.FunctionType, types.SimpleNamespace)


def _modules_of(fn, leaves) -> list[nn.Module]:
    """Modules ``fn`` may use: reachable from it, its closure, globals and arguments."""
    # itself, its ``self``, its closure, a ``partial``'s arguments, the globals it reads, its
    # arguments, and modules held in lists, tuples, dicts and plain objects' attributes among
    # those (one plain object deep)
    found = [m for _, m in leaves if isinstance(m, nn.Module)]
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, nn.Module):
            found.append(f)
        elif isinstance(f, functools.partial):
            todo += [f.func, *f.args, *f.keywords.values()]
        elif inspect.ismethod(f):
            todo.append(f.__self__)
        elif isinstance(f, (list, tuple)):
            todo += [v for v in f if isinstance(v, _CONTAINERS)]
        elif isinstance(f, dict):
            todo += [v for v in f.values() if isinstance(v, _CONTAINERS)]
        elif isinstance(f, types.FunctionType):
            for cell in f.__closure__ or ():
                try:
                    v = cell.cell_contents
                except ValueError:             # a cell not filled yet
                    continue
                if isinstance(v, _CONTAINERS) or _plain_object(v):
                    todo.append(v)          # (a wrapped module's forward is a bound method)
            for name in _global_names(f.__code__):
                v = f.__globals__.get(name)
                if isinstance(v, (nn.Module, list, tuple, dict)):
                    todo.append(v)
        elif _plain_object(f):                 # a user's object holding modules as attributes
            todo += [v for v in vars(f).values() if isinstance(v, (nn.Module, list, tuple, dict))]
    return list({id(m): m for m in found}.values())


def _plain_object(v) -> bool:
    """An instance of a user's class (not a tensor, module, type or builtin) with attributes."""
    return (hasattr(v, "__dict__") and not isinstance(v, (torch.Tensor, nn.Module, type,
                                                           types.ModuleType))
            and type(v).__module__ not in ("builtins", "torch"))


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
    """The version of each tensor argument and module parameter when the forward began, and
    of each leaf tensor requiring grad that the forward read (`_graph_leaves`) when it ended."""

    inputs: list[tuple[str, weakref.ref, int]]
    params: list[tuple[nn.Parameter, int]]
    modules: list[nn.Module]

    @staticmethod
    def capture(leaves, params, modules) -> "_Versions":
        return _Versions([(name, weakref.ref(t), t._version) for name, t in leaves
                          if isinstance(t, torch.Tensor)],
                         [(p, p._version) for p in params], modules)

    def add(self, tensors):
        """Also check these (the leaves the forward read), from their version now on."""
        known = {id(p) for p, _ in self.params}
        self.params += [(t, t._version) for t in tensors if id(t) not in known]

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
        return f"a tensor {_describe(p)} that requires grad and that the function reads"


def _describe(t: torch.Tensor) -> str:
    return _describe_meta(_meta(t))


def _describe_meta(meta: tuple) -> str:
    return f"({tuple(meta[0])}, {str(meta[1]).replace('torch.', '')})"


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


# -------------------------------------------------------------- what the forward read
_ACCUMULATE = torch._C._functions.AccumulateGrad


def _graph_leaves(outputs, since: int, inputs) -> tuple[list, list]:
    """The leaves requiring grad and the outside nodes that the forward's graph reaches."""
    # Walks back from the outputs to where the forward began: the leaves are parameters,
    # wherever the function found them (a module, a dict, an attribute, a partial(F.linear,
    # weight=w)); a node made before `since` (the autograd sequence number when the forward
    # began) that is no input's own is the history of a tensor the function captured.
    # One Python step per node.
    skip = {id(t) for t in inputs}
    own = {t.grad_fn for t in inputs if t.grad_fn is not None}
    todo = [o.grad_fn for o in outputs if o.grad_fn is not None]
    seen, leaves, before = set(), [], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node) is _ACCUMULATE:
            if id(node.variable) not in skip:
                leaves.append(node.variable)
        elif node._sequence_nr() < since:
            if node not in own:
                before.append(node)
        else:
            todo += [f for f, _ in node.next_functions]
    return leaves, before


# ----------------------------------------------------------------------------- fingerprint
_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN = (torch.Tensor, nn.Parameter)


def _fingerprint(t: torch.Tensor) -> torch.Tensor | None:
    """A 0-dim digest of ``t``'s bits: its bytes as 64-bit integers, summed with wrap-around."""
    # Any single changed bit changes it; integer addition does not depend on the order of the
    # reduction (threads, kernels); it needs no temporary (a float64 sum of a float32 tensor
    # makes a float64 copy first: 8 MB for a 4 MB tensor, measured). It runs below the Python
    # dispatch modes, so a policy, a selective checkpoint or track_memory never sees it (nor
    # its 8-byte result). A tensor whose rows do not split into 64-bit words (a non-contiguous
    # view) is read in words of its own width. None without plain strided storage.
    if type(t) not in _PLAIN or t.layout != torch.strided or t.is_meta:
        return None
    size = t.element_size()
    whole = _INT.get(size)
    if whole is None:
        return None
    with torch._C._DisableTorchDispatch():
        d = t.detach()
        if _in_words(d.shape, d.stride(), d.storage_offset(), size):
            return d.view(torch.int64).sum()
        if d.is_contiguous() and d.storage_offset() * size % 8 == 0 and d.dim() > 0:
            flat = d.view(-1)
            head = flat.numel() - flat.numel() % (8 // size)
            return (flat[:head].view(torch.int64).sum()
                    + flat[head:].view(whole).sum(dtype=torch.int64))
        return d.view(whole).sum(dtype=whole)


def _in_words(shape, stride, offset: int, size: int) -> bool:
    """Whether a tensor of ``size``-byte elements can be viewed as 64-bit words in place."""
    if size == 8:
        return True
    k = 8 // size
    return (len(shape) > 0 and (stride[-1] == 1 or shape[-1] == 1) and shape[-1] % k == 0
            and offset % k == 0 and all(st % k == 0 for st in stride[:-1]))


def _first_difference(rows) -> int | None:
    """First row (i, forward's, recompute's, recompute's at the end) that differs; or None."""
    # A row counts only if the recompute's own fingerprint stayed put until the end (see
    # _Frame._compare). One host sync per device.
    by_device: dict = {}
    for k, row in enumerate(rows):
        by_device.setdefault(row[1].device, []).append((k, *row[1:4]))
    first = None
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        for group in by_device.values():
            fwd, rec, end = (torch.stack([g[j] for g in group]) for j in (1, 2, 3))
            bad = (fwd != rec) & (rec == end)
            if bool(bad.any()):
                k = group[int(bad.nonzero()[0, 0])][0]
                first = k if first is None else min(first, k)
    return first


def _op_name(node_class) -> str:
    """``TanhBackward0`` -> ``tanh``: the operation whose backward node class this is."""
    if node_class is None or node_class is type(None):
        return "an operation"
    name = node_class.__name__
    for tail in ("Backward0", "Backward1", "Backward"):
        if name.endswith(tail):
            name = name[: -len(tail)]
            break
    return name.lower() or "an operation"


def _differs(what: str, op: str) -> CheckpointError:
    return CheckpointError(
        f"{what}, made by {op}, has other values in the recompute than in the forward (its "
        "fingerprint differs): the function read something that changed since the forward "
        "(state of a module ckpt_lab does not see, a global, a flag) or ran a nondeterministic "
        "kernel. Keep what it reads unchanged until backward or pass it as an argument; for a "
        "kernel nondeterministic by design pass determinism_check='none'.")


# ================================================================ 3. the two designs, full
_TENSOR = object()   # marks an argument slot that the saved tensors fill


def _flatten(tree) -> tuple[list, object]:
    """``tree_flatten``, with a shortcut for a tensor or a flat tuple/list (spec None, list)."""
    if isinstance(tree, torch.Tensor):
        return [tree], None
    if type(tree) in (tuple, list) and not any(isinstance(v, (list, tuple, dict))
                                               for v in tree):
        return list(tree), type(tree)
    return tree_flatten(tree)


def _unflatten(flat: list, spec):
    """The inverse of `_flatten`."""
    if spec is None:
        return flat[0]
    if spec in (tuple, list):
        return spec(flat)
    return tree_unflatten(flat, spec)


@dataclass
class _Guards:
    """Everything one call checks and replays, shared by both designs."""

    replay: _Replay
    versions: _Versions
    state: ModuleState
    recompute_context: object        # context_fn's second context manager (or None)
    fingerprint: bool                # determinism_check="fingerprint"

    def check(self, saved):
        """Refuse if anything the recompute reads changed since the forward (see _Versions)."""
        self.versions.check()
        self.state.check(CheckpointError)
        for i, s in enumerate(saved):
            if s.edited():
                raise _modified_saved_tensor(i, s.meta[0], s.meta[1], s.probe._version,
                                             s.version)

    @contextlib.contextmanager
    def recomputing(self):
        """Run the block as the forward ran: generators, autocast, module state, context."""
        undo = self.state.swap_in()
        try:
            with self.replay.restored(), torch.enable_grad(), phase("recompute"), \
                    (self.recompute_context or contextlib.nullcontext()):
                yield
        finally:
            self.state.swap_out(undo)


class _Reentrant(torch.autograd.Function):
    """The reentrant node: hands on the outputs its forward (`_checkpoint_reentrant`) made;
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
        self.num_inputs = sum(s is _TENSOR for s in slots)
        self.saved: list[_Saved] = []                # version probes only, nothing kept
        self.outputs = self.differentiable = self.meta = self.digests = None
        self.params: list = []

    def pack(self, t):
        h = _Holder()
        self.saved.append(_Saved(h, t))
        saw_saved(t)
        return h

    @staticmethod
    def unpack(h):
        raise CheckpointError(
            "impl='reentrant' keeps nothing the forward saves, so the checkpointed function "
            "cannot differentiate inside itself (torch.autograd.grad in its forward); use "
            "impl='hooks'.")

    def arguments(self, tensors):
        values = iter(tensors)
        flat = [next(values) if s is _TENSOR else s for s in self.slots]
        if self.spec is tuple:                    # positional arguments only (`_flatten`)
            return tuple(flat), {}
        return tree_unflatten(flat, self.spec)

    def backward(self, inputs, grads):
        """Recompute, check, differentiate: the gradients of the inputs, then of the params."""
        fresh = [_fresh(t) for t in inputs]
        args, kwargs = self.arguments(fresh)
        since = torch._C._autograd._get_sequence_nr()
        with self.guards.recomputing():
            out = self.fn(*args, **kwargs)
        outs = [o for o in _flatten(out)[0] if isinstance(o, torch.Tensor)]
        if len(outs) != len(self.meta):
            raise CheckpointError(
                f"impl='reentrant': the recompute returned {len(outs)} tensors but the forward "
                f"{len(self.meta)}; the checkpointed function must run the same operations "
                "both times.")
        for k, (o, m) in enumerate(zip(outs, self.meta)):
            if _meta(o) != m:
                raise _mismatch(f"impl='reentrant': output {k}", m, _meta(o))
        if self.digests is not None:
            rows = [(k, d, now, now) for k, (d, now) in
                    enumerate(zip(self.digests, map(_fingerprint, outs))) if d is not None]
            k = _first_difference(rows)
            if k is not None:
                o = outs[rows[k][0]]
                raise _differs(f"impl='reentrant': output {rows[k][0]} {_describe(o)}",
                               _op_name(type(o.grad_fn)))
        params, _ = _graph_leaves([o for o in outs if o.requires_grad], since, fresh)
        missing = {id(p) for p in self.params} - {id(p) for p in params}
        for p in self.params:
            if id(p) in missing and isinstance(p, nn.Parameter):
                raise CheckpointError(
                    f"impl='reentrant': the recompute did not read the parameter "
                    f"{_describe(p)} that the forward read: was it replaced by another object "
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


def _checkpoint_reentrant(fn, args, kwargs, guards, forward_context):
    """Design 1 with the checks: forward here, then a `_Reentrant` node over inputs and params."""
    # The forward runs with the caller's grad mode (code that asks torch.is_grad_enabled(), as
    # nn.TransformerEncoder's fast path does, takes the branch it takes without a checkpoint)
    # under a pack hook that keeps nothing; the graph it built says which parameters it read,
    # however it found them. The node takes the inputs *and those parameters* as its inputs,
    # so backward(inputs=[p]) and torch.autograd.grad reach them, and an input that needs no
    # grad is no trap.
    flat, spec = _flatten(args)
    if kwargs or spec is not tuple:               # (spec tuple: flat positional arguments)
        flat, spec = tree_flatten((args, kwargs))
    inputs = [v for v in flat if isinstance(v, torch.Tensor)]
    call = _ReentrantCall(fn, spec, [_TENSOR if isinstance(v, torch.Tensor) else v
                                     for v in flat], guards)
    since = torch._C._autograd._get_sequence_nr()
    with guards.state.watching(), torch.autograd.graph.saved_tensors_hooks(
            call.pack, call.unpack), (forward_context or contextlib.nullcontext()):
        out = fn(*args, **kwargs)
    flat_out, out_spec = _flatten(out)
    outs = [o for o in flat_out if isinstance(o, torch.Tensor)]
    params, before = _graph_leaves(outs, since, inputs)
    if before:
        raise CheckpointError(
            f"impl='reentrant': the function reads a tensor that requires grad and has a "
            f"history outside the checkpoint (the output of {_op_name(type(before[0]))}), not "
            "through its arguments; the reentrant design cannot send it a gradient. Pass it "
            "as an argument or use impl='hooks'.")
    guards.versions.add(params)
    call.params = params
    call.meta = [_meta(o) for o in outs]
    if guards.fingerprint:
        call.digests = [_fingerprint(o) for o in outs]
    call.differentiable = [o.requires_grad for o in outs]
    call.outputs = [o.detach() for o in outs]
    if not outs:
        return out
    results = iter(_Reentrant.apply(call, *inputs, *params))
    return _unflatten([next(results) if isinstance(v, torch.Tensor) else v for v in flat_out],
                      out_spec)


class _Holder:
    """What autograd stores in place of a saved tensor: filled by a recompute."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self):
        self.tensor = None


class _Saved:
    """What the forward recorded about one saved tensor: its holder, metadata and version (and,
    in the hooks design, its fingerprint, and which leaf it is if it is a parameter)."""

    __slots__ = ("holder", "meta", "requires_grad", "probe", "version", "digest", "leaf")

    def __init__(self, holder: _Holder, t: torch.Tensor, digest=None, leaf=None):
        self.holder = weakref.ref(holder)         # dead once autograd no longer needs it
        self.meta, self.requires_grad = _meta(t), t.requires_grad
        self.probe, self.version = _probe(t), t._version
        self.digest, self.leaf = digest, leaf

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

    def __init__(self, fn, args, kwargs, guards: _Guards, early_stop):
        self.fn, self.guards, self.early_stop = fn, guards, early_stop
        self.num_args, self.keys = len(args), list(kwargs)
        values = list(args) + list(kwargs.values())
        self.slots = [_TENSOR if isinstance(v, torch.Tensor) else v for v in values]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        self.input_ids = {id(t) for t in tensors}
        dummy = torch.empty(0, requires_grad=True)
        # Keep the (empty) output: it owns the autograd node, and some PyTorch versions (2.11)
        # free a custom Function's saved tensors once its node has no owner left.
        self.saver_out = _SaveInputs.apply(dummy, *tensors)
        self.saver = self.saver_out.grad_fn
        self.saved: list[_Saved] = []
        self.running = True                       # the forward has not returned yet

    def pack(self, t: torch.Tensor) -> _Holder:
        h = _Holder()
        digest = _fingerprint(t) if self.guards.fingerprint else None
        leaf = t if isinstance(t, nn.Parameter) and id(t) not in self.input_ids else None
        self.saved.append(_Saved(h, t, digest, leaf))
        saw_saved(t)
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

    def inputs(self):
        saved = iter(self.saver.saved_tensors)
        values = [_fresh(next(saved)) if s is _TENSOR else s for s in self.slots]
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
            if _meta(x) != entry.meta:
                raise _mismatch(f"impl='hooks': saved tensor {i}", entry.meta, _meta(x))
            if entry.leaf is not None and x is not entry.leaf:
                raise CheckpointError(
                    f"impl='hooks': saved tensor {i} {_describe(x)} is a parameter that the "
                    "recompute reads as another object than the forward did: was it replaced "
                    "(m.weight = nn.Parameter(...)) between forward and backward, in a module "
                    "ckpt_lab does not see? Replace parameters after backward.")
            stopper.quiet = True
            if entry.digest is not None:
                digests.append((i, entry.digest, _fingerprint(x), type(x.grad_fn)))
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
                self.guards.recomputing():
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
                after = _fingerprint(h.tensor)
                if after is None:
                    continue
            rows.append((i, before, now, after, node))
        k = _first_difference(rows)
        if k is not None:
            i, node = rows[k][0], rows[k][4]
            raise _differs(f"impl='hooks': saved tensor {i} of {n} "
                           f"{_describe_meta(self.saved[i].meta)}", _op_name(node))


def _clear(saved: list):
    """Empty the holders a recompute filled and backward did not use."""
    for s in saved:
        h = s.holder()
        if h is not None:
            h.tensor = None


def _checkpoint_hooks(fn, args, kwargs, inputs, guards, forward_context, early_stop):
    """Design 2 with the checks; the forward's graph adds the parameters it read to them."""
    frame = _Frame(fn, args, kwargs, guards, early_stop)
    since = torch._C._autograd._get_sequence_nr()
    try:
        with guards.state.watching(), torch.autograd.graph.saved_tensors_hooks(
                frame.pack, frame.unpack), (forward_context or contextlib.nullcontext()):
            out = fn(*args, **kwargs)
    finally:
        frame.running = False
    outs = [o for o in _flatten(out)[0] if isinstance(o, torch.Tensor)]
    guards.versions.add(_graph_leaves(outs, since, inputs)[0])
    return out


# =========================================================================== 4. the API
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
    ``policy`` (selective checkpointing, see ``ckpt_lab.selective``) keeps the outputs of the
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
    leaves = _leaves(args, kwargs)
    modules = _modules_of(fn, leaves)
    params = list({id(p): p for m in modules for p in m.parameters()}.values())
    tensors = [t for _, t in leaves if isinstance(t, torch.Tensor)]
    generators = [g for _, g in leaves if isinstance(g, torch.Generator)]
    guards = _Guards(_Replay.capture(tensors + params, generators, preserve_rng_state),
                     _Versions.capture(leaves, params, modules), ModuleState(modules),
                     recompute_context, determinism_check == "fingerprint")
    fn = fn if selective is None else selective
    if impl == "hooks":
        return _checkpoint_hooks(fn, args, kwargs, tensors, guards, forward_context,
                                 early_stop)
    return _checkpoint_reentrant(fn, args, kwargs, guards, forward_context)


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
