"""Exercises of lesson 6: Optimal schedules."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ckpt_lab import formulas

from .base import Exercise, _close, _number

SHRINKING_ACT = [4, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1]    # units: a net whose resolution halves
SHRINKING_OUT = [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]


def _plan_recompute(answer):
    from ckpt_lab.planner import optimal_segments
    plan = optimal_segments(SHRINKING_ACT, SHRINKING_OUT, [1] * len(SHRINKING_ACT), 14)
    value = _number(answer)
    if value == plan.recompute_cost:
        return True, (f"{plan.recompute_cost:g} layers: plan {plan.boundaries} (peak "
                      f"{plan.peak_bytes} units) re-runs everything before its last segment.")
    return False, ("Too many: the last segment is not re-run, so make it as long as the budget "
                   "allows (the small layers at the end are cheap to keep)."
                   if value > plan.recompute_cost else
                   "Too few: with the last segment that long, some earlier segment no longer "
                   "fits; try planner.optimal_segments(act, out, [1] * 12, 14).")


def budget_chain():
    """Lesson 6, exercise 2: eight Linear -> GELU layers of unequal width, their input, and a
    budget for one step's peak (bytes, as track_memory counts them)."""
    torch.manual_seed(0)
    widths = [64, 512, 64, 384, 32, 512, 64, 256, 16]
    layers = [nn.Sequential(nn.Linear(a, b), nn.GELU()) for a, b in zip(widths, widths[1:])]
    x = torch.randn(128, 64)
    return layers, x, int(0.55 * _step_peak(layers, x, [0]))


def _step_peak(layers, x, starts) -> int:
    """Measured peak of checkpoint_sequential + .float().sum().backward(), grads allocated."""
    from ckpt_lab.checkpoint import checkpoint_sequential
    from ckpt_lab.memory import track_memory
    for layer in layers:
        for p in layer.parameters():
            p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        checkpoint_sequential(layers, x, boundaries=starts).float().sum().backward()
    return mem.peak_bytes


def _plan_for_budget(answer):
    from ckpt_lab.checkpoint import segment_starts
    from ckpt_lab.planner import optimal_segments
    from ckpt_lab.profile import profile_layers
    layers, x, budget = budget_chain()
    if not isinstance(answer, (list, tuple)) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in answer):
        return False, "Answer a list of segment starts (layer indices), e.g. [0, 2, 5]."
    try:
        starts = segment_starts(len(layers), boundaries=list(answer))
    except ValueError as e:
        return False, str(e)
    measured = _step_peak(layers, x, starts)
    profile = [dataclasses.replace(p, forward_seconds=1.0)
               for p in profile_layers(layers, x, repeats=1)]
    best = optimal_segments(profile, budget)
    if measured > budget:
        return False, (f"{starts} measures {measured:,} bytes, over the budget of {budget:,}. "
                       "Predict before you run: planner.step_peak_bytes(starts, profile) tells "
                       "you which segment peaks; cut the wide layers finer or start the last "
                       "segment later.")
    if starts[-1] > best.boundaries[-1]:
        return False, (f"{starts} fits ({measured:,} of {budget:,} bytes) but recomputes "
                       f"{starts[-1]} layers; a plan that fits recomputes fewer. The last "
                       "segment is never recomputed: start it as early as the budget allows.")
    return True, (f"{starts} measures {measured:,} of {budget:,} bytes and recomputes "
                  f"{starts[-1]} layers, the fewest any plan that fits can.")


def _bisection_peak(answer):
    expected = formulas.bisection_cost(64, 1, 1).peak_bytes
    return _close(answer, expected, 1e-9,
                  "Too few: every level of the recursion keeps one input while the one "
                  "layer at the bottom keeps its activations: M(n) = max(1 + M(n - n//2), M(n//2)).",
                  "Too many: recursive bisection keeps one input per level, log2(64) levels, "
                  "plus one layer: far less than sqrt segments' 15.")


EXERCISES = [
    Exercise("06.plan_recompute", "A chain of 12 layers keeping [4, 4, 4, 4, 2, 2, 2, 2, 1, 1, "
             "1, 1] units with outputs [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1] units, each costing 1 "
             "to run: under a budget of 14 units, how many layer forwards does the cheapest plan "
             "recompute?",
             _plan_recompute),
    Exercise("06.plan_for_budget", "The chain of exercises.lesson06.budget_chain() (eight Linear -> "
             "GELU layers of unequal width, its input and a budget): choose segment starts so "
             "that one step (checkpoint_sequential + .float().sum().backward()) measures within "
             "the budget while recomputing as few layers as possible. Predict with "
             "planner.step_peak_bytes first; the check measures.", _plan_for_budget),
    Exercise("06.bisection_peak", "64 identical layers, each keeping 1 unit, a kept input 1 "
             "unit: the peak of recursive bisection, in units (formulas.bisection_cost's model)?",
             _bisection_peak),
]
