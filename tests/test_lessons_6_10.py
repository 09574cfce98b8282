"""Lesson 6 (and lesson 10's chains): the step model predicts every measured plan, and lesson 6's
exercises accept answers worked out independently (brute force) and reject wrong ones. Lesson
10's exercises are in test_exercises_10.py."""
import itertools

import pytest
import torch
from torch import nn

from ckpt_lab import memory, planner, profile, profile_layers
from ckpt_lab.lessons import exercises, widgets

from chains import shrinking_convnet




def _all_plans(n):
    for k in range(n):
        for rest in itertools.combinations(range(1, n), k):
            yield [0, *rest]


def test_step_model_predicts_every_plan_and_the_activation_model_stays_below(one_thread):
    layers, x = shrinking_convnet(), torch.randn(4, 3, 16, 16)
    prof = profile_layers(layers, x, repeats=1)
    act, out = [p.act_bytes for p in prof], [p.out_bytes for p in prof]
    gaps = []
    for plan in _all_plans(len(layers)):
        measured = widgets.measure_plan_peak(layers, x, plan)
        assert abs(measured / planner.step_peak_bytes(plan, prof) - 1) <= 0.03, plan
        low = planner.evaluate_plan(plan, act, out, [1] * len(act)).peak_bytes
        assert low < measured
        gaps.append(measured / low)
    assert max(gaps) > 1.3            # what lesson 6's aside shows: the activation model misses


def test_backward_work_counts_the_gradients_of_a_linear():
    torch.manual_seed(0)
    lin = nn.Linear(8, 32)
    x = torch.randn(16, 8)
    work = profile.backward_work_bytes([lin, nn.Tanh()], x)[0]
    # the gradient arriving (16 x 32, from Tanh), the input gradient (16 x 8), the weight and
    # bias gradients computed into fresh tensors before being added to .grad
    expected = (16 * 32 + 16 * 8 + 32 * 8 + 32) * 4
    assert expected - 32 * 4 <= work <= expected
    # the last layer's gradient arrives from .float().sum(): one scalar, expanded (4 bytes),
    # and the loss itself (4 bytes) is alive too
    last = profile.backward_work_bytes([lin], x)[0]
    assert last == expected - 16 * 32 * 4 + 4 + 4


def _brute_force_min_recompute(act, out, budget):
    best = None
    for plan in _all_plans(len(act)):
        ends = plan[1:] + [len(act)]
        kept, peak = 0, 0
        for a, b in zip(plan, ends):
            peak = max(peak, kept + sum(act[a:b]))
            kept += 0 if a == 0 else out[a - 1]
        if peak <= budget:
            best = plan[-1] if best is None else min(best, plan[-1])
    return best


def _bisect(n):
    """(peak units, recomputed layers) of recursive bisection, written out independently."""
    if n == 1:
        return 1, 0
    h = n // 2
    (m1, r1), (m2, r2) = _bisect(h), _bisect(n - h)
    return max(1 + m2, m1), r1 + r2 + h


def _measured_plan_for_budget():
    """The fitting plan of least recompute, found by measuring plans in order of last start."""
    layers, x, budget = exercises.lesson06.budget_chain()
    for plan in sorted(_all_plans(len(layers)), key=lambda p: p[-1]):
        if widgets.measure_plan_peak(layers, x, plan) <= budget:
            return plan


A, O = exercises.lesson06.SHRINKING_ACT, exercises.lesson06.SHRINKING_OUT
RIGHT_WRONG = {
    "06.plan_recompute": (_brute_force_min_recompute(A, O, 14), len(A)),
    "06.plan_for_budget": (_measured_plan_for_budget(), [0]),
    "06.bisection_peak": (_bisect(64)[0], 15),
}


def test_lesson_6_exercises_are_all_covered():
    assert set(RIGHT_WRONG) == set(exercises.keys(6))


@pytest.mark.parametrize("key", sorted(RIGHT_WRONG))
def test_right_answer_passes_wrong_one_gets_a_hint(key, capsys):
    right, wrong = RIGHT_WRONG[key]
    assert exercises.check(key, right) is True
    assert exercises.check(key, wrong) is False
    assert exercises.check(key, None) is False
    assert exercises.check(key, "nonsense") is False
    out = capsys.readouterr().out
    assert "✓" in out and "✗" in out and "not answered yet" in out
