"""Exercises of lesson 3: Segments and sqrt(L)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ckpt_lab import formulas

from .base import Exercise, _close, _number


def chain_peak_units(layers: int, segments: int, width: int = 64, tokens: int = 512) -> float:
    """Measured: the step peak of `layers` MLP blocks in `segments`, in units of one block's
    activations, less the backward's fixed extra (the gradient in flight and one weight
    gradient, measured as the plain run's peak minus its `layers` kept units)."""
    from ckpt_lab.checkpoint import checkpoint_sequential
    from ckpt_lab.memory import track_memory
    from ckpt_lab.models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    unit = x.numel() * x.element_size()
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)
    peaks = []
    for k in (1, segments):
        with track_memory() as log:
            checkpoint_sequential(blocks, x, segments=k).sum().backward()
        peaks.append(log.peak_bytes)
    extra = peaks[0] - layers * unit
    return (peaks[1] - extra) / unit


def _peak_at_six(answer):
    expected = chain_peak_units(16, 6)
    five = chain_peak_units(16, 5)
    value = _number(answer)
    if math.isclose(value, expected, rel_tol=0.02):
        return True, (f"measured {expected:.1f} units at 6 segments, more than {five:.1f} at 5: "
                      "16 // 6 = 2 layers per segment leaves the last one 6 layers.")
    if value < expected:
        return False, ("Too few: checkpoint_sequential makes segments of 16 // 6 = 2 layers "
                       "and the last takes the remainder, 16 - 5 x 2 layers; add the 5 kept "
                       "inputs of the earlier segments.")
    return False, ("Too many: only the last segment is alive in full (16 - 5 x 2 layers), "
                   "plus one kept input for each of the 5 earlier segments.")


def _peak_in_layers(answer):
    expected = formulas.uniform_peak_bytes(36, 6, 1, 1)
    return _close(answer, expected, 1e-9,
                  "Too few: count the kept inputs of every segment before the last one too.",
                  "Too many: only the last segment's 36 / 6 layers are alive at once, plus "
                  "one kept input per earlier segment.")


def _sqrt_growth(answer):
    def best(n):
        s = formulas.optimal_segment_count(n, 1, 1)
        return formulas.uniform_peak_bytes(n, s, 1, 1)
    expected = best(64) / best(16)
    return _close(answer, expected, 0.02,
                  "Too small: 2 sqrt(64) / 2 sqrt(16) = 2 is the continuous estimate; count "
                  "exactly, best(L) = min over whole S of (S - 1) + (layers in the last "
                  "segment): at S = sqrt(L) that is 2 sqrt(L) - 1, not 2 sqrt(L).",
                  "Too large: 4x more layers without checkpoints is 4x the memory, but with "
                  "the best segmentation the peak grows like sqrt(L): (2 sqrt(64) - 1) / "
                  "(2 sqrt(16) - 1).")


EXERCISES = [
    Exercise("03.peak_at_six", "The chain of 16 MLP blocks with checkpoint_sequential(segments=6): "
             "predict its peak in units of one block's activations, counting the kept inputs "
             "and the last segment's layers (leave out the backward's a + w); the check "
             "measures it.", _peak_at_six),
    Exercise("03.peak_in_layers", "36 identical layers in 6 uniform segments: the peak, in "
             "units of one layer's activations (a kept input is one unit)?", _peak_in_layers),
    Exercise("03.sqrt_growth", "With the best segment count each time, by what factor does the "
             "peak grow from 16 to 64 layers?", _sqrt_growth),
]
