"""Exercises of lesson 14 (the loss at large vocabularies). Each prediction's right answer is
measured when it is needed, with `track_memory` and PyTorch's FLOP counter on the loss alone,
``F.cross_entropy(hidden @ W.T, targets)``, at the lesson's CPU sizes; the build task
(`14.chunked_loss`) runs the learner's chunked loss against `F.cross_entropy` (value and
gradients) and against `formulas.chunked_cross_entropy_peak_bytes` (its measured peak)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab import chunked_cross_entropy, formulas
from ckpt_lab.measure.memory import track_memory

from .base import Exercise, near, one_of
from .threads import one_thread

# The lesson's CPU sizes: N = B T rows (4 sequences of 64 tokens), H wide, V words.
ROWS, HIDDEN, VOCAB = 256, 128, 8192
CHUNKS = (1, 2, 4, 8, 16)


def _loss_inputs(rows: int = ROWS, vocab: int = VOCAB, hidden: int = HIDDEN,
                 dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g, dtype=dtype).requires_grad_()
    W = (torch.randn(vocab, hidden, generator=g, dtype=dtype) / hidden ** 0.5).requires_grad_()
    t = torch.randint(0, vocab, (rows,), generator=g)
    return h, W, t


def _plain(h, W, t):
    return F.cross_entropy(h @ W.T, t)


@functools.lru_cache(maxsize=1)
def loss_peak_in_nv() -> float:
    """Measured: the plain loss's peak (forward and backward, from its input) in N x V tensors."""
    h, W, t = _loss_inputs()
    with one_thread(), track_memory() as mem:
        _plain(h, W, t).backward()
    return mem.peak_bytes / (ROWS * VOCAB * 4)


_loss_tensors = near(
    loss_peak_in_nv, 0.25,
    right="{expected:.3f} N x V tensors: in backward, log_softmax's output, the gradient "
          "arriving from nll_loss and the logits' gradient it writes are alive at once.",
    low="Measured {expected:.3f}. The logits are freed after the forward, but log_softmax's "
        "backward needs its output, receives nll_loss's gradient (as large) and writes the "
        "logits' gradient beside both.",
    high="Measured {expected:.3f}. The logits themselves are gone by then: log_softmax's "
         "backward needs only its output, the gradient arriving and the one it writes.")


def chunk_peaks() -> dict[int, int]:
    """Measured: the chunked loss's peak (forward and backward) per chunk count C (measured
    once; a copy each call)."""
    return dict(_chunk_peaks())


@functools.lru_cache(maxsize=1)
def _chunk_peaks() -> tuple:
    h, W, t = _loss_inputs()
    peaks = {}
    for chunks in CHUNKS:
        h.grad = W.grad = None
        with one_thread(), track_memory() as mem:
            chunked_cross_entropy(h, W, t, chunks).backward()
        peaks[chunks] = mem.peak_bytes
    return tuple(peaks.items())


def chunk_floor() -> str:
    """Measured answer of 14.chunk_floor: how the peak moves as C grows past N / H chunks."""
    peaks = list(chunk_peaks().values())
    if peaks[-1] > 1.001 * min(peaks):
        return "rises again"
    if peaks[-1] >= 0.999 * peaks[-2]:
        return "levels off"
    return "keeps falling"


def _floor_facts() -> dict:
    return {"peaks": ", ".join(f"C = {c}: {p / 2 ** 20:.2f} MiB" for c, p in chunk_peaks().items()),
            "rows": ROWS, "hidden": HIDDEN}


_chunk_floor = one_of(
    ("keeps falling", "levels off", "rises again"), chunk_floor,
    right="It {expected} ({peaks}; N = {rows}, H = {hidden}). Each chunk makes its own V x H "
          "weight gradient, and adding the second to the first holds three at once: 3 V H. A "
          "chunk of N / C rows holds 3 (N / C) V beside the running V x H sum, under that floor "
          "once C > 1.5 N / H (chunks of fewer than 2H/3 rows).",
    wrong="Measured: it {expected} ({peaks}).",
    hints={"keeps falling": "Measured: it {expected} ({peaks}). A chunk's logits shrink with C, "
                            "but every chunk makes a V x H weight gradient, and the first sum "
                            "holds three of them at once: no chunk count removes that.",
           "rises again": "Measured: it {expected} ({peaks}). Each chunk's V x H weight gradient "
                          "is added to one running sum and freed, so more chunks cost time, not "
                          "memory."},
    normalise=lambda a: " ".join(a.lower().split()), facts=_floor_facts)


@functools.lru_cache(maxsize=1)
def chunk_flops_ratio() -> float:
    """Measured: FLOPs of the loss in 8 checkpointed chunks over the plain loss's (forward and
    backward, counted by FlopCounterMode), minus one."""
    h, W, t = _loss_inputs()
    flops = []
    for loss in (lambda: _plain(h, W, t), lambda: chunked_cross_entropy(h, W, t, 8)):
        with one_thread(), FlopCounterMode(display=False) as counter:
            loss().backward()
        flops.append(counter.get_total_flops())
    return flops[1] / flops[0] - 1


_chunk_price = near(
    chunk_flops_ratio, 0.04,
    right="+{expected:.1%}: a third. The output layer's forward is one matmul (2 N H V FLOPs) "
          "and its backward two (the gradients of hidden and of W); recomputing each chunk's "
          "logits adds one more forward.",
    low="Measured +{expected:.1%}. The checkpoint re-runs each chunk's hidden @ W.T in "
        "backward: one forward matmul more on top of the three (one forward, two backward).",
    high="Measured +{expected:.1%}. Only the forward matmul is re-run, once per chunk, and "
         "backward already costs twice a forward: one matmul more on three.")


def _check_values(answer) -> str | None:
    """Why `answer`'s value or gradients differ from F.cross_entropy's (None: they agree)."""
    for rows, vocab, hidden, chunks in ((37, 50, 16, 8), (48, 64, 8, 1), (40, 30, 12, 5)):
        h, W, t = _loss_inputs(rows, vocab, hidden, torch.float64, seed=rows)
        t[::3] = -100                                    # padding, as a collator marks it
        want = _plain(h, W, t)
        want_grads = torch.autograd.grad(want, (h, W))
        got = answer(h, W, t, chunks)
        if got is None:
            return ("not answered yet: your chunked_loss returns None. Write its body: a "
                    "checkpointed sum per chunk of rows, then the mean.")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            return f"chunked_loss returned {type(got).__name__}; return the loss, a scalar tensor."
        if not torch.allclose(got.detach(), want.detach(), rtol=1e-10, atol=0):
            ratio = float(got.detach() / want.detach())
            why = ("a sum: divide by the number of targets that are not -100"
                   if ratio > 2 else "take each chunk's sum (reduction='sum'), add them, and "
                   "divide once by the number of targets that are not -100 (padding is "
                   "skipped, so not by len(t), and not a mean of chunk means)")
            return (f"{rows} rows (every third target -100), {chunks} chunks: your loss is "
                    f"{got.item():.6f} where F.cross_entropy gives {want.item():.6f}: {why}.")
        grads = torch.autograd.grad(got, (h, W))
        if not all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(grads, want_grads)):
            return ("the value is right but the gradients differ: let autograd run through "
                    "every chunk (no .detach(), no torch.no_grad()).")
    return None


def _check_peak(answer) -> tuple[bool, str]:
    """The learner's measured peak against the formula, fp32, at the lesson's sizes."""
    shown = []
    for chunks in (4, 8):
        h, W, t = _loss_inputs()
        with one_thread(), track_memory() as mem:
            answer(h, W, t, chunks).backward()
        want = formulas.chunked_cross_entropy_peak_bytes(ROWS, VOCAB, HIDDEN, chunks,
                                                         tracked=True)
        shown.append(f"C = {chunks}: {mem.peak_bytes:,} bytes measured, {want:,} by the "
                     "formula")
        if mem.peak_bytes > 1.001 * want + 64:
            plain = formulas.cross_entropy_peak_bytes(ROWS, VOCAB, HIDDEN)
            return False, (f"value and gradients are right, but the peak is too high ("
                           f"{shown[-1]}; the plain loss: {plain:,}). Compute "
                           "each chunk's loss inside torch.utils.checkpoint.checkpoint(fn, "
                           "h_chunk, t_chunk, use_reentrant=False), so that no chunk's logits "
                           "outlive it.")
    return True, "; ".join(shown)


def _chunked_loss(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('14.chunked_loss', "
                       "chunked_loss), taking (hidden, W, targets, C).")
    try:
        why = _check_values(answer)
        if why:
            return False, why
        ok, shown = _check_peak(answer)
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"chunked_loss raised {type(e).__name__}: {e}"
    if not ok:
        return False, shown
    return True, ("value and gradients equal F.cross_entropy's (padding included, float64), "
                  f"and the peak is the formula's: {shown}.")


EXERCISES = [
    Exercise("14.loss_tensors", f"The plain loss F.cross_entropy(hidden @ W.T, y), N = {ROWS} "
             f"rows, H = {HIDDEN}, V = {VOCAB:,} words, fp32: at its peak (forward and "
             "backward), how many N x V tensors are alive at once?", _loss_tensors,
             expected=loss_peak_in_nv),
    Exercise("14.chunk_floor", "The loss in C checkpointed chunks of rows, C = 1, 2, 4, 8, 16 "
             f"(N = {ROWS} rows, H = {HIDDEN}): as C grows, the peak 'keeps falling', "
             "'levels off' or 'rises again'?", _chunk_floor, expected=chunk_floor),
    Exercise("14.chunk_price", "By what fraction does computing the loss in 8 checkpointed "
             "chunks raise its FLOPs (forward and backward, counted by FlopCounterMode), e.g. "
             "0.5 for +50%?", _chunk_price, expected=chunk_flops_ratio),
    Exercise("14.chunked_loss", "Build task: write chunked_loss(hidden, W, targets, C), the "
             "mean cross-entropy of hidden @ W.T (hidden N x H, W V x H) over C chunks of rows, "
             "each chunk's summed loss inside torch.utils.checkpoint.checkpoint; targets of -100 "
             "are padding. The check compares value and gradients with F.cross_entropy and the "
             "measured peak with formulas.chunked_cross_entropy_peak_bytes.", _chunked_loss),
]
