"""Lesson 6's predictions: each right answer, worked out independently (every plan enumerated,
the bisection recursion written out, plans measured), passes; the usual wrong ones get a hint."""
import itertools

import pytest

from ckpt_lab import planner
from ckpt_lab.lessons import exercises, widgets
from ckpt_lab.lessons.exercises import lesson06

from exercise_checks import judge, unanswered_and_malformed


def _bisect(n):
    """(peak units, re-run layers) of recursive bisection, written out independently."""
    if n == 1:
        return 1, 0
    h = n // 2
    (m1, r1), (m2, r2) = _bisect(h), _bisect(n - h)
    return max(1 + m2, m1), r1 + r2 + h


def test_planner_saving_against_every_plan_enumerated():
    """The planner's plan is the cheapest of all 2^12 plans within each uniform plan's peak."""
    layers, x, profile = lesson06.conv_net()
    n, saved = len(layers), []
    plans = [[0, *rest] for k in range(n) for rest in itertools.combinations(range(1, n), k)]
    peaks = {tuple(p): planner.step_peak_bytes(p, profile) for p in plans}
    cost = lambda p: planner.evaluate_plan(p, profile).recompute_cost   # noqa: E731
    for k in range(2, 9):
        uniform = planner.evaluate_plan(planner.uniform_plan(n, k), profile)
        cheapest = min(p[-1] for p in plans if peaks[tuple(p)] <= uniform.peak_bytes)
        best = next(cost(p) for p in plans if p[-1] == cheapest)
        saved.append(1 - best / uniform.recompute_cost)
    assert exercises.EXERCISES["06.planner_saving"].expected() == pytest.approx(max(saved))
    assert judge("06.planner_saving", round(max(saved), 2))
    assert not judge("06.planner_saving", 0.0) and not judge("06.planner_saving", 1.0)


def test_which_fit_by_measuring_each_plan():
    layers, x, profile = lesson06.conv_net()
    fits = {name for name, plan in lesson06.FIT_PLANS.items()
            if widgets.measure_plan_peak(layers, x, plan) <= lesson06.FIT_BUDGET}
    assert fits == exercises.EXERCISES["06.which_fit"].expected() and fits != set(lesson06.FIT_PLANS)
    act, out = [p.act_bytes for p in profile], [p.out_bytes for p in profile]
    assert all(planner.evaluate_plan(plan, act, out, [1] * len(act)).peak_bytes <= lesson06.FIT_BUDGET
               for plan in lesson06.FIT_PLANS.values())    # the activation model says all fit
    assert judge("06.which_fit", fits)
    assert not judge("06.which_fit", set(lesson06.FIT_PLANS))
    assert not judge("06.which_fit", {"D"})


def test_bisection_growth_is_one_unit_as_the_recursion_says():
    assert _bisect(32)[0] - _bisect(16)[0] == 1
    assert exercises.EXERCISES["06.bisection_growth"].expected() == pytest.approx(1.0)
    assert judge("06.bisection_growth", 1)
    assert not judge("06.bisection_growth", 2 ** 0.5 * 4) and not judge("06.bisection_growth", 16)


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(6), "many", capsys)
    assert len(exercises.keys(6)) == 3
