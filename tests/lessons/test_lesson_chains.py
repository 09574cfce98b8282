"""Lesson 6 (and lesson 10's chains): the step model predicts every measured plan, and the
activation model stays below it. Lesson 6's predictions are tested in test_exercises_06.py,
lesson 10's in test_exercises_10.py."""
import itertools

import torch
from torch import nn

from ckpt_lab import planner, profile_layers
from ckpt_lab.plan import profile
from ckpt_lab.lessons import widgets

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
