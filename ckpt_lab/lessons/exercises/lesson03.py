"""Predictions of lesson 3: the best segment count, where a segmented step peaks, and how
the best peak grows with depth. Each answer is measured on a chain of MLP blocks (512 tokens,
width 64), parameter gradients allocated beforehand: with PyTorch's checkpoint_sequential, and
for the peak's moment with ckpt_lab's, whose `boundaries` make a first segment longer than the
last (uniform segments never do)."""
from __future__ import annotations

import functools

import torch
from torch import nn

from ckpt_lab import formulas

from .base import Exercise, _number, near, one_of

MOMENTS = ("end of forward", "start of backward", "a recompute tooth")


def chain_logs(layers: int, segments, width: int = 64, tokens: int = 512) -> dict:
    """Measured: {S: MemoryLog} of one step of `layers` MLP blocks for each segment count S."""
    from torch.utils.checkpoint import checkpoint_sequential
    from ckpt_lab.lessons.recompute_label import label_recompute
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)                 # model state, made before measuring
    logs = {}
    for k in segments:
        with track_memory() as logs[k], label_recompute(blocks):
            checkpoint_sequential(blocks, k, x, use_reentrant=False).sum().backward()
    return logs


def units(logs: dict, layers: int, width: int = 64, tokens: int = 512) -> dict:
    """Each peak in units of one block's activations, less the backward's fixed a + w (the
    plain run's peak minus its `layers` kept units)."""
    unit = tokens * width * 4
    extra = logs[1].peak_bytes - layers * unit
    return {k: (log.peak_bytes - extra) / unit for k, log in logs.items()}


def chain_peak_units(layers: int, segments: int) -> float:
    """Measured: the peak of `layers` blocks in `segments`, in units, less a + w."""
    return units(chain_logs(layers, (1, segments)), layers)[segments]


@functools.lru_cache(maxsize=1)
def best_segments() -> int:
    """Measured: the segment count with the least peak for 16 blocks (ties: fewer)."""
    logs = chain_logs(16, range(1, 17))
    return min(logs, key=lambda k: (logs[k].peak_bytes, k))


def moment_of(log) -> str:
    """Where a step's peak falls: before the first recompute, in backward, or in forward."""
    from ckpt_lab.lessons.plots import phase_spans
    top = max(log.timeline, key=lambda p: p.live_bytes)
    if top.phase == "forward":
        return "end of forward"
    spans = phase_spans(log, "recompute")
    return "start of backward" if not spans or top.step < spans[0][0] else "a recompute tooth"


UNEVEN = [0, 12]    # segment starts: a 12-block first segment, checkpointed, and a 4-block last one


def uneven_log(layers: int = 16, boundaries=tuple(UNEVEN), width: int = 64, tokens: int = 512):
    """Measured: the MemoryLog of one step of `layers` MLP blocks under ckpt_lab's
    checkpoint_sequential with segments starting at `boundaries` (its recompute is labelled)."""
    from ckpt_lab import checkpoint_sequential
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)                 # model state, made before measuring
    with track_memory() as log:
        checkpoint_sequential(blocks, x, boundaries=list(boundaries)).sum().backward()
    return log


@functools.lru_cache(maxsize=1)
def peak_moment() -> str:
    """Measured: where the step of 16 blocks in segments starting at UNEVEN peaks."""
    return moment_of(uneven_log())


@functools.lru_cache(maxsize=1)
def sqrt_growth() -> float:
    """Measured: best peak of 64 blocks over best peak of 16, in units, less a + w."""
    best = {n: formulas.optimal_segment_count(n, 1, 1) for n in (16, 64)}
    return chain_peak_units(64, best[64]) / chain_peak_units(16, best[16])


def _best(answer):
    expected = best_segments()
    value = _number(answer)
    if value == expected:
        last = 16 - (expected - 1) * (16 // expected)
        return True, (f"{expected}: {expected - 1} kept inputs and a last segment of {last} "
                      f"blocks, {expected - 1 + last} units; fewer segments leave a longer last "
                      "segment, more leave more kept inputs.")
    if value <= 2:
        return False, (f"Measured best: {expected}. With few segments the last one is long, "
                       "and backward holds all of it at once.")
    if value > 8:
        return False, (f"Measured best: {expected}. Past L/2 = 8 every segment but the last is "
                       "one block, whose kept input the plain run keeps anyway: nothing is saved.")
    return False, (f"Measured best: {expected}, about sqrt(16). Count kept inputs (S - 1) plus "
                   "the last segment's blocks (16 - (S - 1) x (16 // S)) for your S.")


_moment = one_of(
    MOMENTS, peak_moment,
    right="{expected}: rebuilding the 12-block first segment holds 12 blocks' activations at "
          "once, more than the start of backward holds (1 kept input and the 4-block last "
          "segment). Uniform segments never give a tooth that wins: none is longer than the last.",
    hints={"end of forward": "Measured: {expected}. Backward adds gradients before it frees "
                             "anything, so the peak is always after the forward ends.",
           "start of backward": "Measured: {expected}. Count both moments in blocks: the start "
                                "of backward holds 1 kept input and the 4-block last segment; "
                                "the recompute of the first segment rebuilds 12 blocks."},
    wrong="Measured: {expected}. Count the blocks alive at each moment.")

_growth = near(
    sqrt_growth, 0.02, relative=True,
    low="Too small: 2 sqrt(64) / 2 sqrt(16) = 2 is the continuous estimate; whole segments give "
        "2 sqrt(L) - 1 units at S = sqrt(L), so (16 - 1) / (8 - 1).",
    high="Too large: 4x the layers is 4x the memory only without checkpoints; with the best "
         "segments the peak grows like sqrt(L).")


EXERCISES = [
    Exercise("03.best_segments", "16 blocks Linear -> ReLU with checkpoint_sequential: which "
             "segment count S (1 to 16) gives the least peak?", _best, expected=best_segments),
    Exercise("03.peak_moment", "The 16 blocks with ckpt_lab.checkpoint_sequential(blocks, x, "
             "boundaries=[0, 12]): a 12-block first segment, checkpointed, and a 4-block last one. "
             "Where in the step is the peak? One of 'end of forward', 'start of backward', "
             "'a recompute tooth'.", _moment,
             expected=peak_moment),
    Exercise("03.sqrt_growth", "With the best segment count each time, by what factor does the "
             "peak (in units of one block's activations, without the backward's a + w) grow "
             "from 16 to 64 blocks?", _growth, expected=sqrt_growth),
]
