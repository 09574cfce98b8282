"""Lesson 6's exercises: each prediction's right answer, worked out independently (every plan
enumerated, the bisection recursion written out, plans measured against a formula), passes;
the usual wrong ones get a hint. The build task's judge accepts recursive bisection written
with torch's checkpoint and rejects the plausible wrong ones. And the lesson's net keeps
measured seconds in its profile: the FLOPs the lesson plans on are passed as fwd_cost."""
import itertools

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab import formulas, planner
from ckpt_lab.lessons import exercises, widgets
from ckpt_lab.lessons.exercises import lesson06

from exercise_checks import judge, right_then_wrong, unanswered_and_malformed


def _bisect(n):
    """(peak units, re-run layers) of recursive bisection, written out independently."""
    if n == 1:
        return 1, 0
    h = n // 2
    (m1, r1), (m2, r2) = _bisect(h), _bisect(n - h)
    return max(1 + m2, m1), r1 + r2 + h


def test_last_segment_against_every_plan_enumerated():
    """The cheapest of all 2^12 plans within each uniform plan's step peak starts its last
    segment earlier (a longer last segment) at every S from 2 to 8."""
    layers, x, profile = lesson06.conv_net()
    flops = lesson06.forward_flops(layers, x)
    n = len(layers)
    plans = [[0, *rest] for k in range(n) for rest in itertools.combinations(range(1, n), k)]
    peaks = {tuple(p): planner.step_peak_bytes(p, profile) for p in plans}
    pairs = []
    for S in range(2, 9):
        uniform = planner.evaluate_plan(planner.uniform_plan(n, S), profile, fwd_cost=flops)
        cheapest = min(p[-1] for p in plans if peaks[tuple(p)] <= uniform.peak_bytes)
        pairs.append((n - uniform.boundaries[-1], n - cheapest))
    assert pairs == lesson06.last_segments() and all(b > u for u, b in pairs)
    assert exercises.EXERCISES["06.last_segment"].expected() == "longer"
    assert judge("06.last_segment", "longer") and judge("06.last_segment", " Longer ")
    assert not judge("06.last_segment", "equal") and not judge("06.last_segment", "shorter")
    assert not judge("06.last_segment", "later")                # not one of the three


def test_the_lessons_profile_holds_seconds_and_the_flops_are_passed_as_fwd_cost():
    layers, x, profile = lesson06.conv_net()
    flops = lesson06.forward_flops(layers, x)
    assert all(0 < p.forward_seconds < 1 for p in profile)      # measured time, not FLOPs
    assert list(lesson06.conv_flops()) == flops and min(flops) > 1000
    plan = planner.uniform_plan(len(layers), 4)
    assert planner.evaluate_plan(plan, profile, fwd_cost=flops).recompute_cost == sum(flops[:9])


def test_read_low_by_measuring_each_plan_against_the_formula():
    """Each plan measured, and read by formulas.segmented_peak_bytes directly: the activation
    model reads both low, the plan of short segments far lower."""
    layers, x, profile = lesson06.conv_net()
    act, out = [p.act_bytes for p in profile], [p.out_bytes for p in profile]
    gaps = {name: widgets.measure_plan_peak(layers, x, plan)
            / formulas.segmented_peak_bytes(plan, act, out)
            for name, plan in lesson06.READ_PLANS.items()}
    assert gaps == pytest.approx(lesson06.read_gaps(), rel=1e-9)
    assert 1 < gaps["no checkpoint"] < 1.1 < 1.4 < gaps["segments of 2"]
    assert exercises.EXERCISES["06.read_low"].expected() == "segments of 2"
    assert judge("06.read_low", "segments of 2") and judge("06.read_low", " Segments of  2")
    assert not judge("06.read_low", "no checkpoint") and not judge("06.read_low", "the same")
    assert not judge("06.read_low", {"A"})                      # not one of the three


def test_bisection_growth_is_one_unit_as_the_recursion_says():
    assert _bisect(32)[0] - _bisect(16)[0] == 1
    assert exercises.EXERCISES["06.bisection_growth"].expected() == pytest.approx(1.0)
    assert judge("06.bisection_growth", 1)
    assert not judge("06.bisection_growth", 2 ** 0.5 * 4) and not judge("06.bisection_growth", 16)


def bisected(layers, x):
    """The worked solution of the build task (notebooks/solutions/06_*)."""
    if len(layers) == 1:
        return layers[0](x)
    half = len(layers) // 2
    x = torch.utils.checkpoint.checkpoint(bisected, layers[:half], x, use_reentrant=False)
    return bisected(layers[half:], x)


def segments_not_bisected(layers, x):
    """Checkpoints the first half whole, recursing only into the second: log L segments."""
    if len(layers) == 1:
        return layers[0](x)
    half = len(layers) // 2
    x = torch.utils.checkpoint.checkpoint(nn.Sequential(*layers[:half]), x, use_reentrant=False)
    return segments_not_bisected(layers[half:], x)


def plain(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def test_bisected_judge_accepts_torch_nested_checkpoints_and_rejects_the_near_misses(capsys):
    right_then_wrong("06.bisected", bisected, segments_not_bisected, "layer forwards", capsys)
    assert not exercises.check("06.bisected", plain)
    assert "no checkpoint took effect" in capsys.readouterr().out
    assert not exercises.check("06.bisected", lambda layers, x: layers[0](x))
    assert "gradients differ" in capsys.readouterr().out
    assert not exercises.check("06.bisected", lambda layers, x: None)
    assert "not answered yet" in capsys.readouterr().out


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(6), "many", capsys)
    assert exercises.keys(6) == ["06.last_segment", "06.read_low", "06.bisection_growth",
                                 "06.bisected"]
