"""Selective checkpointing: a policy decides, operation by operation, what to save.

Plain checkpointing recomputes everything inside the region. Some operations are expensive to
recompute and cheap to keep (a matmul's output is as big as the activation after it, but
costs far more FLOPs than the pointwise ops around it), so a *policy* picks, for each ATen
operation the function runs, SAVE (keep its output through backward) or RECOMPUTE.

How, written from scratch (PyTorch's ``create_selective_checkpoint_contexts`` is the oracle):

* forward: a ``TorchDispatchMode`` sees every operation. For each one the policy says SAVE
  to, it keeps a detached reference to the output, in a list per operation.
* recompute: a second mode counts the same operations again; the n-th call of an operation
  whose n-th forward output was saved returns that output instead of running.

Two kinds of operation are always recomputed, whatever the policy says:

* random ones (tag ``nondeterministic_seeded``: dropout's ``bernoulli_``, ``rand``...). The
  checkpoint replays the random generator, so recomputing them draws the same numbers, while
  skipping one would leave the generator behind and shift every later draw. (PyTorch 2.13
  honours SAVE for them and then computes wrong gradients silently when a later random op is
  recomputed; ``tests/checkpoint/test_selective.py`` shows ours stays exact.)
* views and in-place operations: a view costs nothing to recompute and saving one would pin
  its base, and skipping an in-place op would leave the recompute's tensor unmodified.

A policy is ``policy(op, *args, **kwargs) -> bool | Decision`` (True means SAVE), a collection
of ops (saved, everything else recomputed), or the name of one in ``POLICIES``.

What it costs beyond the recomputed ops themselves: every op of the function passes through a
Python dispatch mode, in the forward and again in the recompute (a few microseconds each, which
shows on tiny models and vanishes on large ones). Which ops are always recomputed is worked out
once per op, and a policy that answers from the op alone (the named ones, collections, or any
callable with ``policy.by_op_only = True``) is asked once per op instead of once per call.
"""
from __future__ import annotations

import enum
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Decision(enum.Enum):
    """What a policy returns for one operation (``True``/``False`` mean SAVE/RECOMPUTE)."""

    SAVE = "save"
    RECOMPUTE = "recompute"


def _ops(*names: str) -> frozenset:
    aten = torch.ops.aten
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


MATMUL_OPS = _ops(
    "mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "matmul", "linear",
    "mv", "addmv", "dot", "_scaled_mm", "_int_mm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)


def _by_op_only(policy):
    """Mark a policy whose answer depends on the op alone, so it is asked once per op."""
    policy.by_op_only = True
    return policy


@_by_op_only
def save_matmuls(op, *args, **kwargs) -> bool:
    """Save outputs of matrix multiplies and fused attention; recompute everything else."""
    return op.overloadpacket in MATMUL_OPS


@_by_op_only
def recompute_all(op, *args, **kwargs) -> bool:
    """Save nothing: the same as a plain checkpoint (useful as a baseline)."""
    return False


POLICIES = {"save_matmuls": save_matmuls, "recompute_all": recompute_all}


def resolve_policy(policy):
    """A policy callable from a callable, a name in ``POLICIES`` or a collection of ops."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; valid names are {sorted(POLICIES)}, "
                             "or pass a callable policy(op, *args, **kwargs) -> bool")
        return POLICIES[policy]
    if callable(policy):
        return policy
    if isinstance(policy, (list, tuple, set, frozenset)):
        ops = frozenset(policy)
        for op in ops:
            if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                raise ValueError(f"a policy given as a collection must hold ATen ops such as "
                                 f"torch.ops.aten.mm, got {op!r}")
        return _by_op_only(lambda op, *a, **k: op in ops or op.overloadpacket in ops)
    raise ValueError(f"policy must be a callable, a collection of ops or one of "
                     f"{sorted(POLICIES)}, got {type(policy).__name__}")


_ALWAYS_RECOMPUTED: dict = {}


def _always_recomputed(op) -> bool:
    """Random, mutating and view ops: recomputed whatever the policy says (cached per op)."""
    hit = _ALWAYS_RECOMPUTED.get(op)
    if hit is None:
        schema = op._schema
        hit = _ALWAYS_RECOMPUTED[op] = (
            torch.Tag.nondeterministic_seeded in op.tags or schema.is_mutable
            or any(r.alias_info is not None for r in schema.returns))
    return hit


def _to_save(policy, op, args, kwargs) -> bool:
    """The policy's answer for this call as a bool (True: SAVE)."""
    choice = policy(op, *args, **kwargs)
    if isinstance(choice, bool):
        return choice
    if isinstance(choice, Decision):
        return choice is Decision.SAVE
    raise TypeError(f"the policy returned {choice!r} for {op}; return True/False or "
                    "Decision.SAVE/Decision.RECOMPUTE")


_RECOMPUTE = object()
_USED = object()


class _Saved:
    """A detached output kept for the recompute, with the version it had when kept."""

    __slots__ = ("value", "versions")

    def __init__(self, out):
        if isinstance(out, (tuple, list)):   # an op returns a tensor or a flat tuple/list
            self.value = type(out)(_detach_sharing_version(t) for t in out)
        else:
            self.value = _detach_sharing_version(out)
        self.versions = [t._version for t in _tensors(self.value)]


def _detach_sharing_version(t):
    """``t.detach()`` from below autograd that still sees later in-place edits of ``t``.

    Inside a dispatch mode the ADInplaceOrView key is excluded, and without it a detached alias
    gets its own version counter; turning the key back on makes it share ``t``'s.
    """
    if not isinstance(t, torch.Tensor):
        return t
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False):
        return t.detach()


def _tensors(out) -> list:
    """The tensors of an op's output: a tensor or a flat tuple/list of them."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if isinstance(t, torch.Tensor)] if isinstance(out, (tuple, list)) \
        else []


class _Saving(TorchDispatchMode):
    """Forward: runs every op, keeps outputs of those the policy saves."""

    def __init__(self, policy, store):
        super().__init__()
        self.policy, self.store = policy, store
        # A policy that looks at the op alone is asked once per op, not once per call.
        self.by_op: dict | None = {} if getattr(policy, "by_op_only", False) else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _always_recomputed(func):
            return out
        if self.by_op is None:
            keep = _to_save(self.policy, func, args, kwargs)
        else:
            keep = self.by_op.get(func)
            if keep is None:
                keep = self.by_op[func] = _to_save(self.policy, func, args, kwargs)
        self.store[func].append(_Saved(out) if keep else _RECOMPUTE)
        return out


class _Replaying(TorchDispatchMode):
    """Recompute: hands back saved outputs, runs everything else."""

    def __init__(self, store, error):
        super().__init__()
        self.store, self.error = store, error
        self.calls: dict = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _always_recomputed(func):
            return func(*args, **kwargs)
        i = self.calls[func]
        self.calls[func] += 1
        entries = self.store.get(func, [])
        if i >= len(entries):
            raise self.error(f"the recompute ran {func} {i + 1} times but the forward only "
                             f"{len(entries)}; the checkpointed function must run the same "
                             "operations both times.")
        entry = entries[i]
        if entry is _RECOMPUTE:
            return func(*args, **kwargs)
        if entry is _USED:
            raise self.error("a selective checkpoint can be back-propagated through only once "
                             "(its saved outputs are handed over, not copied); run the forward "
                             "again instead of backward(retain_graph=True).")
        entries[i] = _USED
        if any(t._version != v for t, v in zip(_tensors(entry.value), entry.versions)):
            raise self.error(f"the output of {func} was saved by the policy and then modified "
                             "in place inside the checkpointed function, so it no longer holds "
                             "what the recompute needs. Make that in-place op out-of-place or "
                             "let the policy recompute this op.")
        return entry.value


class SelectiveFunction:
    """``fn`` wrapped so its first call saves what the policy chooses and later calls reuse it."""

    def __init__(self, fn, policy, error=RuntimeError):
        self.fn, self.policy, self.error = fn, resolve_policy(policy), error
        self.store = None

    def __call__(self, *args, **kwargs):
        if self.store is None:
            self.store = defaultdict(list)
            with _Saving(self.policy, self.store):
                return self.fn(*args, **kwargs)
        try:
            with _Replaying(self.store, self.error):
                return self.fn(*args, **kwargs)
        finally:
            # A recompute that stopped early never asks for the rest: free it now.
            for entries in self.store.values():
                entries[:] = [_USED if e is not _RECOMPUTE else e for e in entries]
