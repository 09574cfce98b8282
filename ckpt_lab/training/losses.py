"""Cross-entropy over a large vocabulary without ever holding the full logits.

A language model's loss projects N hidden rows (N = batch x sequence) onto a V-word vocabulary,
``logits = hidden @ weight.T``, and takes ``log_softmax``: an N x V tensor, and in backward its
gradient beside it. At a 128K vocabulary that outweighs every other activation of a small
model, and the step's peak sits there (lessons 0 and 1 find it at ``log_softmax``).

`chunked_cross_entropy` splits the rows into chunks and computes each chunk's logits and its
summed loss inside a checkpoint (ckpt_lab's own, ``impl="hooks"``): the forward keeps only the
chunk's inputs (a view of ``hidden``, the weight, the targets), so no chunk's logits outlive
it, and backward recomputes one chunk's logits at a time, turns them into their gradient and
drops them before the next chunk's recompute. The mean is taken over the rows whose target is
not ``ignore_index``, as ``F.cross_entropy`` does. In bf16 and fp16 each chunk's losses and the
chunks' sum are added in fp32 and the result rounded once: added in their own dtype, the sums
lose more than the plain loss does (tests/training/test_losses.py measures both).

Where the peak sits with chunking: in the backward of one chunk, when ``log_softmax``'s
backward writes the chunk's logit gradient while its recomputed output and the incoming
gradient (``nll_loss``'s, as large) are still alive: three c x V tensors (c = rows of the
largest chunk), on top of what stays for the whole step (the weight's gradient summed so far,
the row gradients of the chunks already done). Once chunks are small (c below about d) the peak
moves to the weight gradients instead: each chunk makes its own V x d gradient, and autograd's
first sum of two of them is out of place (each arrives as a view, through ``weight.t()``'s
backward), so three V x d tensors coexist for a moment; smaller chunks save nothing more.
`ckpt_lab.plan.formulas.chunked_cross_entropy_moments` counts every candidate; tests/training/test_losses.py
holds the peak to `track_memory` and to the allocator's own events.

The price: one more ``hidden @ weight.T`` per row (2 N d V FLOPs, a third of the output
layer's forward + backward), and per chunk a V x d weight gradient written and added, which
is what makes many small chunks slow.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checkpoint import checkpoint
from ..plan.formulas import chunk_rows


_LOW = (torch.bfloat16, torch.float16)
REDUCTIONS = ("mean", "sum", "none")


def _chunk_loss(hidden, weight, targets, ignore_index: int, label_smoothing: float,
                per_row: bool):
    """Cross-entropy of one chunk of rows, per row or summed (its logits exist only in here).
    A bf16 or fp16 sum is taken in fp32: summed in its own dtype, 64 rows of about 7 nats
    already lose a unit in the last place of a number near 450."""
    logits = hidden @ weight.t()
    kw = {"ignore_index": ignore_index, "label_smoothing": label_smoothing}
    if per_row or logits.dtype in _LOW:
        rows = F.cross_entropy(logits, targets, reduction="none", **kw)
        return rows if per_row else rows.float().sum()
    return F.cross_entropy(logits, targets, reduction="sum", **kw)


def _loss_dtype(hidden, weight) -> torch.dtype:
    """The dtype ``F.cross_entropy`` returns for these inputs' logits (fp32 under autocast)."""
    dtype = torch.promote_types(hidden.dtype, weight.dtype)
    if dtype in _LOW and torch.is_autocast_enabled(hidden.device.type):
        return torch.float32
    return dtype


def _check(hidden, weight, targets):
    if not (isinstance(hidden, torch.Tensor) and isinstance(weight, torch.Tensor)
            and isinstance(targets, torch.Tensor)):
        raise TypeError("hidden, weight and targets must be tensors")
    if hidden.dim() < 2:
        raise ValueError(f"hidden must be (N, d) or (B, T, d), got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.size(1) != hidden.size(-1):
        raise ValueError(f"weight must be (V, d) with d = hidden's last size "
                         f"({hidden.size(-1)}), got shape {tuple(weight.shape)}; pass the output "
                         "layer's weight (nn.Linear(d, V).weight), not its transpose")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.is_complex():
        raise ValueError(f"targets must be class indices (an integer tensor), got "
                         f"{targets.dtype}; soft-label targets are not supported")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]) and not (
            targets.dim() == 1 and targets.numel() == hidden.numel() // hidden.size(-1)):
        raise ValueError(f"targets must have hidden's leading shape {tuple(hidden.shape[:-1])} "
                         f"(or be flat with that many rows), got {tuple(targets.shape)}")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunks: int, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                          reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets)`` over row chunks, each checkpointed.

    hidden: (N, d) or (B, T, d), flattened to rows like targets (N) or (B, T). weight: (V, d),
    the bias-free output projection. chunks: 1..N; rows are split as evenly as possible.
    ``ignore_index``, ``label_smoothing`` and ``reduction`` are ``F.cross_entropy``'s: by
    default the mean loss over rows whose target is not ``ignore_index`` (NaN when there are
    none, as in PyTorch), ``"sum"`` their sum, ``"none"`` one loss per row (0 where ignored),
    shaped like ``targets``. Value and gradients equal the unchunked loss up to float rounding
    (the chunks' sums are added in another order; in bf16 and fp16 they are added in fp32 and
    rounded once); the full N x V logits never exist.
    """
    _check(hidden, weight, targets)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, as in F.cross_entropy; "
                         f"got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number from 0.0 to 1.0, as in "
                         f"F.cross_entropy; got {label_smoothing!r}")
    rows = hidden.reshape(-1, hidden.size(-1))
    flat = targets.reshape(-1)
    sizes = chunk_rows(rows.size(0), chunks)
    per_row, total, parts = reduction == "none", None, []
    for h, t in zip(rows.split(sizes), flat.split(sizes)):
        # No random numbers are drawn here: saving the RNG state would cost 5 KB per chunk.
        part = checkpoint(_chunk_loss, h, weight, t, ignore_index, float(label_smoothing),
                          per_row, impl="hooks", preserve_rng_state=False)
        if per_row:
            parts.append(part)
        else:
            total = part if total is None else total + part
    if per_row:
        return torch.cat(parts).reshape(targets.shape)
    if reduction == "mean":
        total = total / (flat != ignore_index).sum()
    return total.to(_loss_dtype(hidden, weight))
