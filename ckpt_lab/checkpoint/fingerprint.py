"""A fingerprint of a tensor's bits, to refuse a recompute whose values differ from the forward's.
(Design note 10, in NOTES.md.)

``determinism_check="fingerprint"`` takes a digest of every saved tensor (the reentrant design:
of every output) in the forward and again in the recompute; a difference raises
`CheckpointError` naming the tensor and the operation that made it. It sees what the other
checks (`guards`) cannot: a generator the function finds by itself, another thread drawing from
the global one, state of a module `hidden_inputs` misses, ``p.data`` edits, nondeterministic kernels.
It reads every saved tensor twice more, so it is off by default (what that costs:
``benchmarks/bench_checkpoint.py``, its ``fingerprint_cost``).
"""
from __future__ import annotations

import torch
from torch import nn

from .guards import CheckpointError, op_name


_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN = (torch.Tensor, nn.Parameter)


def fingerprint_of(t: torch.Tensor) -> torch.Tensor | None:
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


def first_difference(rows) -> int | None:
    """First row (i, forward's, recompute's, recompute's at the end) that differs; or None."""
    # A row counts only if the recompute's own fingerprint stayed put until the end (see
    # hooks._Recompute._compare). One host sync per device.
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


def check_digests(rows, name) -> None:
    """Refuse the first row (index, forward's, recompute's, recompute's at the end, node class)
    whose fingerprint differs; ``name(index)`` names its tensor."""
    k = first_difference(rows)
    if k is not None:
        raise differs(name(rows[k][0]), op_name(rows[k][4]))


def differs(what: str, op: str) -> CheckpointError:
    """The refusal when a recomputed tensor's fingerprint is not the forward's."""
    return CheckpointError(
        f"{what}, made by {op}, has other values in the recompute than in the forward (its "
        "fingerprint differs): the function read something that changed since the forward "
        "(state of a module ckpt_lab does not see, a global, a flag) or ran a nondeterministic "
        "kernel. Keep what it reads unchanged until backward or pass it as an argument; for a "
        "kernel nondeterministic by design pass determinism_check='none'.")
