"""Predictions of lesson 6 (where checkpoints go when the layers are not alike).

Each right answer is measured when it is needed, on the lesson's chain at its CPU sizes
(`conv_net`): a 13-layer convolutional net that works at four scales, each half the image and
twice the channels of the one before, profiled with `profile_layers`, its forward FLOPs the cost
of re-running a layer.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.lessons.units import MIB

from .base import Exercise, _name_set, near

# Exercise 06.which_fit: three plans for the CPU-sized net and a budget for their step peak.
FIT_PLANS = {"A": [0, 2, 4, 6, 8, 10], "B": [0, 1, 3], "C": [0, 2, 4]}
FIT_BUDGET = int(1.75 * MIB)
BISECT_WIDTH, BISECT_TOKENS, BISECT_DEPTHS = 64, 256, (8, 16, 32)


def conv(c_in: int, c_out: int, stride: int = 1) -> nn.Module:
    """Conv 3x3 (no bias), BatchNorm, ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


def _conv_net(channels: int, per_scale: int, batch: int, image: int, device):
    torch.manual_seed(0)
    layers = [conv(3, channels)] + [conv(channels, channels) for _ in range(per_scale - 1)]
    for scale in range(1, 4):
        c = channels * 2 ** scale
        layers += [conv(c // 2, c, stride=2)] + [conv(c, c) for _ in range(per_scale - 1)]
    layers += [nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * channels, 10))]
    layers = [layer.to(device) for layer in layers]
    return layers, torch.randn(batch, 3, image, image, device=device)


def forward_flops(layers, x) -> list[int]:
    """Each layer's forward FLOPs, counted by PyTorch."""
    flops, h = [], x
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        for layer in layers:
            before = counter.get_total_flops()
            h = layer(h)
            flops.append(counter.get_total_flops() - before)
    return flops


@functools.lru_cache(maxsize=4)
def conv_net(channels: int = 8, per_scale: int = 3, batch: int = 8, image: int = 32,
             device: str = "cpu"):
    """The lesson's chain, its input and its profile: `per_scale` conv layers at each of four
    scales (each halves the image and doubles the channels), then a pooled linear head,
    profiled by `profile_layers`. The planner prices re-running a layer by the profile's
    `forward_seconds`; that field holds the layer's forward FLOPs here (`forward_flops`),
    since per-layer timings jitter on a shared CPU. Built once per size: the lesson and the checks of its
    predictions share it (`widgets.measure_plan_peak` leaves it as it found it)."""
    from ckpt_lab.plan.profile import profile_layers
    layers, x = _conv_net(channels, per_scale, batch, image, torch.device(device))
    profile = [dataclasses.replace(p, forward_seconds=f)   # FLOPs in the planner's cost field
               for p, f in zip(profile_layers(layers, x, repeats=1), forward_flops(layers, x))]
    return layers, x, profile


def planner_saving() -> float:
    """On the CPU-sized net: the most recompute the planner saves against uniform segments
    (S = 1..8 segments) within the uniform plan's step peak (the step model, which the lesson checks
    against the measured peak of every plan), as a fraction."""
    from ckpt_lab import planner
    layers, x, profile = conv_net()
    saved = []
    for k in range(1, 9):
        uniform = planner.evaluate_plan(planner.uniform_plan(len(layers), k), profile)
        if uniform.recompute_cost:
            best = planner.optimal_segments(profile, uniform.peak_bytes)
            saved.append(1 - best.recompute_cost / uniform.recompute_cost)
    return max(saved)


_planner_saving = near(
    planner_saving, 0.1,
    right="{expected:.0%} less, at best: the planner cuts the big first scale finely, where an "
          "input is cheap to keep and quick to re-run, and leaves the small last scales in one "
          "long last segment, which is never re-run.",
    low="Measured: up to {expected:.0%} less. Uniform segments cannot tell a boundary in the big "
        "first scale from one in the small last scale; the planner keeps the last segment as "
        "long as memory allows.",
    high="Measured: up to {expected:.0%} less. At the same peak something must still be re-run: "
         "every layer before the last segment's start.")


def fit_question() -> dict:
    """The plans of exercise 06.which_fit, each with the activation model's peak (formulas.segmented_peak_bytes)."""
    from ckpt_lab import planner
    _, _, profile = conv_net()
    act = [p.act_bytes for p in profile]
    out = [p.out_bytes for p in profile]
    cost = [p.forward_seconds for p in profile]
    return {name: planner.evaluate_plan(plan, act, out, cost).peak_bytes
            for name, plan in FIT_PLANS.items()}


def measured_fit_peaks() -> dict:
    """Measured step peak of each plan of exercise 06.which_fit."""
    from ckpt_lab.lessons.widgets import measure_plan_peak
    layers, x, _ = conv_net()
    return {name: measure_plan_peak(layers, x, plan) for name, plan in FIT_PLANS.items()}


def which_fit() -> set:
    """Measured: the plans of exercise 06.which_fit whose step peak fits the budget."""
    return {name for name, peak in measured_fit_peaks().items() if peak <= FIT_BUDGET}


def _which_fit(answer):
    given, why = _name_set(answer, FIT_PLANS, "plan names")
    if why:
        return False, why
    peaks = measured_fit_peaks()
    shown = ", ".join(f"{n} {p / MIB:.2f} MiB" for n, p in peaks.items())
    expected = {n for n, p in peaks.items() if p <= FIT_BUDGET}
    if given == expected:
        return True, (f"{sorted(expected)}. Measured: {shown}, budget {FIT_BUDGET / MIB:.2f} MiB. "
                      "The activation model said all three fit; it leaves out each segment's own "
                      "input and backward's working memory.")
    missing, extra = sorted(expected - given), sorted(given - expected)
    if extra:
        return False, (f"{extra} measure over the budget ({shown}). The activation model is "
                       "always low: it counts neither a segment's input nor the gradients and "
                       "temporaries of backward. Check with planner.step_peak_bytes(plan, profile).")
    return False, (f"{missing} fit too ({shown}): a plan with many short segments keeps more "
                   "inputs, but each segment's backward is small.")


def bisection_growth() -> float:
    """Measured: how many units (one block's activation) the recursive-bisection step peak
    grows when a chain of identical MLPBlocks doubles from 16 to 32 blocks."""
    from ckpt_lab import checkpoint_recursive
    from ckpt_lab.lessons.widgets import measure_plan_peak
    from ckpt_lab.training.models import MLPBlock

    class Bisected(nn.Module):
        def __init__(self, chain):
            super().__init__()
            self.chain = chain

        def forward(self, t):
            return checkpoint_recursive(self.chain, t)

    x = torch.randn(BISECT_TOKENS, BISECT_WIDTH, requires_grad=True)
    unit = x.numel() * x.element_size()
    peaks = []
    for depth in BISECT_DEPTHS[-2:]:
        torch.manual_seed(0)
        chain = nn.Sequential(*[MLPBlock(BISECT_WIDTH) for _ in range(depth)])
        peaks.append(measure_plan_peak([Bisected(chain)], x, [0]))
    return (peaks[1] - peaks[0]) / unit


_bisection_growth = near(
    bisection_growth, 0.25,
    right="{expected:g} unit: one more level of recursion, so one more kept input; memory grows "
          "as log2(L).",
    low="Measured {expected:g}: a deeper recursion keeps one more input while its deepest level "
        "runs.",
    high="Measured {expected:g}. Segments grow like sqrt(L) and no checkpoint like L; bisection "
         "keeps one input per level of recursion, and doubling adds one level.")


EXERCISES = [
    Exercise("06.planner_saving", "The lesson's 13-layer net at its CPU sizes: at the step peak "
             "uniform segments (S = 1..8 segments) measure, the planner's cheapest plan re-runs what "
             "fraction fewer forward FLOPs, at best (0 to 1)?", _planner_saving,
             expected=planner_saving),
    Exercise("06.which_fit", "The 13-layer net at its CPU sizes, plans "
             + ", ".join(f"{n} = {p}" for n, p in FIT_PLANS.items())
             + f": the activation model (kept inputs + last segment, without backward's a + w: "
             f"formulas.segmented_peak_bytes) puts all three under a {FIT_BUDGET / MIB:.2f} MiB "
             "budget. Which fit when one training step is measured? Give a set of names.",
             _which_fit, expected=which_fit),
    Exercise("06.bisection_growth", "Recursive bisection of identical MLPBlocks: doubling the "
             "depth from 16 to 32 blocks raises the step peak by how many units (one block's "
             "activation)?", _bisection_growth, expected=bisection_growth),
]
