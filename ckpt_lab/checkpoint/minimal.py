"""The two checkpoint designs PyTorch has used, each at its smallest (about 25 lines).
(Design note 1, in NOTES.md.)

1. ``MinimalReentrant`` (PyTorch's ``use_reentrant=True``): an ``autograd.Function`` runs the
   function under ``no_grad``, so nothing inside is saved, and keeps only its input. Its
   backward re-runs the function with grad enabled and back-propagates through that fresh
   graph: the autograd engine re-entered from inside itself.
2. ``minimal_hooks`` (``use_reentrant=False``): the function runs normally, but under
   ``saved_tensors_hooks`` whose pack hook lets autograd store a small handle instead of each
   tensor it wants to save. The first unpack in backward re-runs the function and hands the
   recomputed tensors to the original graph, in the order they were saved.

Both are exact for a deterministic function that nobody modifies in place; `hooks` and
`reentrant` are these two with every guard of ``ckpt_lab.checkpoint`` applied.
"""
from __future__ import annotations

import torch


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
