"""Predictions of lesson 7 (combining checkpointing, accumulation, bf16 and offload).

Each right answer is measured when it is needed, on the lesson's GPT at its CPU sizes (the
gpt-cpu shape: 4 blocks, C = 128, 4 heads, T = 64, batch 4, dropout off): peaks with
`track_memory`, the parameter gradients allocated beforehand; FLOPs with `FlopCounterMode`.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.measure.memory import track_memory
from ckpt_lab.training.models import build_model, get_config

from .base import Exercise, near, one_of

BATCH, SEQ, LAYERS, HIDDEN, HEADS = 4, 64, 4, 128, 4
ORDER = ("below", "equal", "above")


@functools.lru_cache(maxsize=1)
def _batch():
    from ckpt_lab.training.data import TextBatches, load_corpus
    return TextBatches(load_corpus(), BATCH, SEQ).get(0)


def _model(policy: str = "none"):
    cfg = get_config("gpt-cpu", block_size=SEQ, n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS,
                     dropout=0.0)
    return build_model(cfg, policy=policy, impl="torch")


def _steps(model, micro_batches: int, precision: str):
    x, y = _batch()
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        with torch.autocast("cpu", torch.bfloat16) if precision == "bf16" \
                else contextlib.nullcontext():
            loss = model(xm, ym) / micro_batches
        loss.backward()


def step_peak(policy: str = "none", micro_batches: int = 1, precision: str = "fp32") -> int:
    """Measured peak of one step of the lesson's CPU GPT (parameter gradients allocated)."""
    model = _model(policy)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        _steps(model, micro_batches, precision)
    return mem.peak_bytes


def autocast_ratio() -> float:
    """Measured: a bf16-autocast step's peak over the fp32 step's."""
    return step_peak(precision="bf16") / step_peak()


_autocast = near(
    autocast_ratio, 0.07,
    right="x{expected:.2f}: not x0.5. Autocast keeps the weights in fp32 and makes a bf16 copy "
          "of each for its matmuls, which autograd keeps; the layer norms, softmax and loss "
          "still work in fp32.",
    low="Measured x{expected:.2f}. Only some tensors become bf16: autocast runs matmuls in bf16 "
        "but layer norms, softmax and the loss in fp32, and keeps a bf16 copy of every weight it "
        "multiplies by.",
    high="Measured x{expected:.2f}: the matmul outputs, most of the activations, are stored in 2 "
         "bytes instead of 4.")


def accumulation_flops_ratio(micro_batches: int = 4) -> float:
    """Measured: FLOPs of a step split into `micro_batches` over FLOPs of the whole batch."""
    model = _model()
    counts = []
    for k in (1, micro_batches):
        with FlopCounterMode(display=False) as counter:
            _steps(model, k, "fp32")
        counts.append(counter.get_total_flops())
    return counts[1] / counts[0]


_accumulation_flops = near(
    accumulation_flops_ratio, 0.01,
    right="x{expected:g}: accumulation re-runs nothing; every row goes through one forward and "
          "one backward, in four smaller pieces.",
    low="Every row of the batch still goes through the whole forward and backward once: the "
        "arithmetic is the same.",
    high="Accumulation recomputes nothing: it runs the same rows in four smaller pieces (smaller "
         "matmuls, the same FLOPs).")


def bf16_small_batch_ratio() -> float:
    """Measured: with every block checkpointed and micro-batches of one row (4 of them), the
    bf16-autocast step's peak over the fp32 step's."""
    return (step_peak("every", BATCH, "bf16") / step_peak("every", BATCH, "fp32"))


def bf16_small_batch() -> str:
    """The side of 1 the ratio above lies on: "below", "equal" (within 2%) or "above"."""
    r = bf16_small_batch_ratio()
    return "equal" if abs(r - 1) <= 0.02 else ("above" if r > 1 else "below")


_bf16_small = one_of(
    ORDER, bf16_small_batch, normalise=lambda s: s.strip().lower(),
    facts=lambda: {"r": bf16_small_batch_ratio()},
    right="{expected} (x{r:.2f}): the bf16 copies of the weights autocast keeps do not shrink "
          "with the micro-batch, while the activations they save on do; with every block "
          "checkpointed there is little activation left to halve.",
    wrong="Measured x{r:.2f}. With every block checkpointed and one row per micro-batch the "
          "activations are small, but autocast still keeps a bf16 copy of every weight it "
          "multiplies by: a cost per model, not per row.")


EXERCISES = [
    Exercise("07.autocast_ratio", "The lesson's GPT (gpt-cpu shape, batch 4, T = 64, fp32 "
             "weights): with bf16 autocast, the step's peak is what multiple of the fp32 step's?",
             _autocast, expected=autocast_ratio),
    Exercise("07.accumulation_flops", "Splitting a step's batch into 4 micro-batches "
             "(accumulation): FLOPs of the step with accumulation divided by FLOPs without?",
             _accumulation_flops, expected=accumulation_flops_ratio),
    Exercise("07.bf16_small_batch", "The lesson's GPT with every block checkpointed and 4 "
             "micro-batches of one row: is the bf16-autocast step's peak below, equal to or "
             "above the fp32 step's?", _bf16_small, expected=bf16_small_batch),
]
