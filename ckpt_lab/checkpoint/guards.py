"""The checks a checkpoint makes so that a recompute that would differ is refused, not used.
(Design notes 7 and 9, in NOTES.md.)

A checkpoint runs its function twice and differentiates the second run as if it were the
first; nothing in autograd checks that claim. These do, each a silent wrong gradient otherwise:

* metadata: every recomputed saved tensor (or output) must have the forward's shape, dtype and
  device (`meta_of`, `mismatch`); a function that branches on global state is refused.
* versions: plain autograd refuses a saved tensor modified in place ("modified by an inplace
  operation"); a checkpoint saves no tensor for autograd to check, so `Versions` checks by
  itself the tensor arguments, the parameters of the modules that ran and every leaf its
  graph reached (`hidden_inputs.graph_leaves`), and each saved tensor through a storage-less
  alias sharing its version counter (`probe`). An optimizer step before backward is refused.
* holders: under saved-tensor hooks autograd stores whatever the pack hook returns; a
  checkpoint returns a `Holder`, empty until the recompute fills it with the tensor that was
  saved and emptied again once backward has used it, so the activation lives only between the
  two. Beside it the forward notes a `Saved` record (the holder, by weak reference; the
  tensor's metadata, version and fingerprint; whether it is a parameter) that the checks
  compare the recompute against. The reentrant design keeps records only, for their probes.
* `Guards` bundles what one call checks and replays (the generators and autocast, `replay`;
  the module state, `module_state`; ``context_fn``'s recompute context; whether to compare
  fingerprints, `fingerprint`; with ``debug=True`` the trace of both runs, `debug`), shared by
  both designs: `Guards.check` before a recompute, `Guards.recomputing` around it.

Every check refuses with `CheckpointError` (``ckpt_lab.CheckpointError``), naming the tensor
(`describe`) and the operation (`op_name`), and saying what to do.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..measure.memory import phase


class CheckpointError(RuntimeError):
    """The recomputation would not reproduce the forward, so gradients would be wrong."""


# ------------------------------------------------------------------------------- messages
def describe(t: torch.Tensor) -> str:
    """``(shape, dtype)`` of a tensor, for messages."""
    return describe_meta(meta_of(t))


def describe_meta(meta: tuple) -> str:
    """``(shape, dtype)`` from `meta_of`'s tuple, for messages."""
    return f"({tuple(meta[0])}, {str(meta[1]).replace('torch.', '')})"


def op_name(node_class) -> str:
    """``TanhBackward0`` -> ``tanh``: the operation whose backward node class this is."""
    if node_class is None or node_class is type(None):
        return "an operation"
    name = node_class.__name__
    for tail in ("Backward0", "Backward1", "Backward"):
        if name.endswith(tail):
            name = name[: -len(tail)]
            break
    return name.lower() or "an operation"


# ------------------------------------------------------------------------------- metadata
def meta_of(t: torch.Tensor) -> tuple:
    """What the recompute must reproduce of a tensor: its shape, dtype and device."""
    return (t.shape, t.dtype, t.device)


def mismatch(what: str, forward: tuple, recompute: tuple) -> CheckpointError:
    """The refusal when a recomputed tensor's metadata is not the forward's."""
    def show(m):
        return f"shape {tuple(m[0])}, dtype {str(m[1]).replace('torch.', '')}, device {m[2]}"
    return CheckpointError(
        f"{what} had {show(forward)} in the forward but {show(recompute)} in the recompute; "
        "the checkpointed function must run the same operations both times (no branching on "
        "global state or on a call counter).")


# -------------------------------------------------------------------------------- versions
_EMPTY: dict[torch.device, torch.Tensor] = {}


def probe(t: torch.Tensor) -> torch.Tensor | None:
    """A storage-less alias of ``t`` that shares its version counter: sees in-place edits of
    ``t`` (and of its views and base) without keeping its memory alive."""
    try:
        with torch._C._DisableTorchDispatch():   # unseen by context_fn's and track_memory's modes
            alias = t.detach()
            empty = _EMPTY.get(t.device)
            if empty is None:
                empty = _EMPTY[t.device] = torch.empty(0, device=t.device)
            alias.data = empty                # drops the storage, keeps the version counter
        return alias
    except (RuntimeError, TypeError):         # inference tensors, exotic subclasses
        return None


@dataclass
class Versions:
    """The version of each tensor argument when the forward began, and, when it ended, of each
    parameter it read: those of the modules that ran in it and every leaf tensor requiring grad
    that its graph reached (`graph_leaves`). Taken then, a parameter its own module changes
    in the forward (``nn.Embedding(max_norm=...)``, ``nn.LazyLinear``'s first call) is read by
    the recompute as the forward left it, and a later block's optimizer step in backward
    (torchtune's optimizer in backward) is no edit of what this region read."""

    inputs: list[tuple[str, weakref.ref, int]]
    params: list[tuple[nn.Parameter, int]]
    modules: list[nn.Module]

    @staticmethod
    def capture(leaves, modules) -> "Versions":
        """The arguments' versions now, as the forward starts."""
        return Versions([(name, weakref.ref(t), t._version) for name, t in leaves
                         if isinstance(t, torch.Tensor)], [], modules)

    def add(self, tensors):
        """Also check these (what the forward read), from their version now on."""
        known = {id(p) for p, _ in self.params}
        self.params += [(t, t._version) for t in tensors if id(t) not in known]

    def check(self):
        """Refuse if an argument or a parameter was modified in place since the forward."""
        for name, ref, version in self.inputs:
            t = ref()
            if t is not None and t._version != version:
                raise CheckpointError(
                    f"{name} of the checkpointed function {describe(t)} was modified in "
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
        """The parameter's name in its module, for messages."""
        for m in self.modules:
            for name, q in m.named_parameters():
                if q is p:
                    return f"parameter '{name}' of {type(m).__name__}"
        return f"a tensor {describe(p)} that requires grad and that the function reads"


def _modified_saved_tensor(i: int, shape, dtype, now: int, then: int) -> CheckpointError:
    """The refusal when a saved tensor was modified in place after it was saved."""
    return CheckpointError(
        f"tensor {i} that the checkpointed function saved for backward ({tuple(shape)}, "
        f"{str(dtype).replace('torch.', '')}) was modified in place after it was saved (now at "
        f"version {now}, saved at {then}): plain autograd refuses this too ('modified by an "
        "inplace operation'). If it is an intermediate result, make the in-place operation "
        "out-of-place (y = y * 3, not y.mul_(3)); if it is a parameter or a captured tensor, "
        "do not change it between the forward and the backward.")


# --------------------------------------------------------------------------------- holders
class Holder:
    """What autograd stores in place of a saved tensor: filled by a recompute."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self):
        self.tensor = None


class Saved:
    """What the forward recorded about one saved tensor: its holder, metadata and version (and,
    in the hooks design, its fingerprint, and which leaf it is if it is a parameter)."""

    __slots__ = ("holder", "meta", "requires_grad", "probe", "version", "digest", "leaf")

    def __init__(self, holder: Holder, t: torch.Tensor, digest=None, leaf=None):
        self.holder = weakref.ref(holder)         # dead once autograd no longer needs it
        self.meta, self.requires_grad = meta_of(t), t.requires_grad
        self.probe, self.version = probe(t), t._version
        self.digest, self.leaf = digest, leaf

    def edited(self) -> bool:
        """Modified in place since it was saved, while autograd still needs it."""
        return (self.probe is not None and self.probe._version != self.version
                and self.holder() is not None)


# ---------------------------------------------------------------------- one call's guards
@dataclass
class Guards:
    """Everything one call checks and replays, shared by both designs."""

    replay: object                   # replay.Replay: the generators and autocast
    versions: Versions
    state: object                    # module_state.ModuleState: the modules' state
    recompute_context: object        # context_fn's second context manager (or None)
    fingerprint: bool                # determinism_check="fingerprint"
    trace: object = None             # debug.Trace with debug=True

    def check(self, saved):
        """Refuse if anything the recompute reads changed since the forward (see Versions)."""
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
                    (self.recompute_context or contextlib.nullcontext()), \
                    (self.trace.start_recompute() if self.trace else contextlib.nullcontext()):
                yield
        finally:
            self.state.swap_out(undo)

    def explain(self, error: CheckpointError) -> CheckpointError:
        """``error``, with the operations of the forward and the recompute if ``debug=True``."""
        return error if self.trace is None else self.trace.explain(error)
