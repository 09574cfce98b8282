"""The step model on chains whose layers write their input in place or get strided inputs.

A VGG-style chain (``Conv2d``, ``ReLU(inplace=True)``, ``MaxPool2d`` as layers of their own),
an in-place first layer, a ``Linear`` fed a slice and a ``Flatten`` of a transposed input:
profiling leaves the caller's tensors alone, plans never start a checkpointed segment at a
layer that writes its input in place, and every plan the step can run measures exactly what
`planner.step_peak_bytes` predicts (`widgets.measure_plan_peak`, the oracle being
`track_memory` on the step itself).
"""
import itertools
import random

import pytest
import torch
from torch import nn

from ckpt_lab import checkpoint_sequential, planner, profile_layers
from ckpt_lab.lessons import widgets


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def vgg():
    """torchvision's VGG layout, small: in-place ReLUs, pools, a classifier with dropout."""
    torch.manual_seed(0)
    return [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(32, 10)]


IN_PLACE = [1, 3, 6, 10]


class Cut(nn.Module):
    """Drops the first position: a strided view, which the next Linear copies and saves."""

    def forward(self, x):
        return x[:, 1:]


class Swap(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


class EveryOther(nn.Module):
    """Every other channel: a slice that Flatten cannot view (a contiguous clone of it could)."""

    def forward(self, x):
        return x[:, ::2]


def all_plans(n):
    for k in range(n):
        for rest in itertools.combinations(range(1, n), k):
            yield [0, *rest]


def runs(layers, x, plan) -> bool:
    """Whether the step runs this plan; a refused one must fail with the clear error."""
    try:
        widgets.measure_plan_peak(layers, x, plan)
    except ValueError as e:
        assert "writes the input of the checkpointed segment" in str(e)
        return False
    return True


def step_grads(layers, x, plan, seed=3):
    params = [p for layer in layers for p in layer.parameters()]
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_(x.requires_grad)
    torch.manual_seed(seed)
    checkpoint_sequential(layers, x, boundaries=plan).float().sum().backward()
    return [p.grad for p in params] + ([x.grad] if x.requires_grad else [])


@pytest.mark.parametrize("requires_grad", [False, True])
def test_vgg_plans_are_exact_never_start_at_an_in_place_layer_and_keep_gradients(requires_grad):
    layers = vgg()
    x = torch.randn(2, 3, 16, 16, requires_grad=requires_grad)
    before = x.detach().clone()
    prof = profile_layers(layers, x, repeats=1)
    assert torch.equal(x, before)
    assert [i for i, p in enumerate(prof) if p.writes_input] == IN_PLACE
    assert all(prof[i].output_is_view for i in IN_PLACE)
    # the planner's plans, tightest to none: measured exactly, never a refused boundary
    front = planner.pareto_front(prof)
    assert len(front) > 2
    plain = step_grads(layers, x, [0])
    for plan in front:
        assert not set(plan.boundaries[:-1]) & set(IN_PLACE), plan   # checkpointed starts
        assert widgets.measure_plan_peak(layers, x, plan.boundaries) == plan.peak_bytes, plan
        ours = step_grads(layers, x, plan.boundaries)
        assert all(torch.equal(a, b) for a, b in zip(plain, ours)), plan
    least, none = front[0].peak_bytes, front[-1].peak_bytes
    assert least < 0.75 * none
    for budget in (least, (least + none) // 2, int(0.95 * none)):
        plan = planner.optimal_segments(prof, budget)
        assert widgets.measure_plan_peak(layers, x, plan.boundaries) == plan.peak_bytes <= budget
    # any plan: the model refuses exactly what the step refuses, and predicts the rest exactly
    plans = list(all_plans(len(layers)))
    random.Random(0).shuffle(plans)
    counts = {True: 0, False: 0}
    for plan in plans[:80]:
        ok = runs(layers, x, plan)
        counts[ok] += 1
        if ok:
            assert planner.step_peak_bytes(plan, prof) == \
                widgets.measure_plan_peak(layers, x, plan), plan
        else:
            with pytest.raises(ValueError, match="writes its input in place"):
                planner.step_peak_bytes(plan, prof)
    assert counts[True] > 5 and counts[False] > 5


def test_an_in_place_first_layer_leaves_the_callers_input_and_forbids_checkpointing_it():
    torch.manual_seed(0)
    layers = [nn.Dropout(0.5, inplace=True), nn.Linear(8, 64), nn.ReLU(inplace=True),
              nn.Linear(64, 8)]
    x = torch.randn(16, 8)
    before = x.clone()
    prof = profile_layers(layers, x, repeats=1)
    assert torch.equal(x, before)
    assert [p.writes_input for p in prof] == [True, False, True, False]
    none = widgets.measure_plan_peak(layers, x.clone(), [0])
    assert planner.step_peak_bytes([0], prof) == none
    # the first segment keeps x, which layer 0 writes: only the plain step runs
    with pytest.raises(ValueError, match="only boundaries=\\[0\\]"):
        planner.step_peak_bytes([0, 2], prof)
    with pytest.raises(planner.BudgetTooSmallError) as err:
        planner.plan_chain(layers, x, none - 1, repeats=1)
    assert err.value.minimum_bytes == none
    assert torch.equal(x, before)
    with pytest.raises(ValueError, match="no plan but boundaries=\\[0\\]"):
        checkpoint_sequential(layers, x.clone(), boundaries=[0, 2])


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_checkpoint_sequential_refuses_a_boundary_at_an_in_place_layer_in_the_forward(impl):
    layers = vgg()
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    with pytest.raises(ValueError, match=r"layer 3 \(ReLU\(inplace=True\)\) writes the input of "
                                         r"the checkpointed segment starting at layer 3.*"
                                         r"Start that segment at layer 4"):
        checkpoint_sequential(layers, x, boundaries=[0, 3, 5], impl=impl)
    # a view in front of the writer: the segment's input is written all the same
    torch.manual_seed(0)
    chain = [nn.Linear(8, 8), nn.Flatten(), nn.ReLU(inplace=True), nn.Linear(8, 2)]
    with pytest.raises(ValueError, match="layer 2 .* starting at layer 1"):
        checkpoint_sequential(chain, torch.randn(4, 8, requires_grad=True), boundaries=[0, 1, 3],
                              impl=impl)
    # the last segment may start there: it is not checkpointed
    assert checkpoint_sequential(layers, x, boundaries=[0, 3], impl=impl).shape == (2, 10)
    with torch.no_grad():   # nothing is recomputed without grad
        checkpoint_sequential(layers, x, boundaries=[0, 3, 5], impl=impl)


def test_a_step_that_fails_whatever_the_plan_is_refused_by_the_profile():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="leaf"):
        profile_layers([nn.ReLU(inplace=True), nn.Linear(8, 8)],
                       torch.randn(4, 8, requires_grad=True), repeats=1)
    with pytest.raises(ValueError, match="layer 1 .*which layer 0 saved"):   # sigmoid saves y
        profile_layers([nn.Sigmoid(), nn.ReLU(inplace=True), nn.Linear(8, 8)],
                       torch.randn(4, 8, requires_grad=True), repeats=1)
    with pytest.raises(ValueError, match="layer 2 .*which layer 1 saved"):   # relu_ saves y
        profile_layers([nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Dropout(0.5, inplace=True)],
                       torch.randn(4, 8), repeats=1)


def test_a_linear_fed_a_slice_is_profiled_with_the_copy_it_saves():
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.Tanh(), Cut(), nn.Linear(256, 64), nn.Tanh(),
              nn.Linear(64, 8)]
    x = torch.randn(8, 16, 64)
    prof = profile_layers(layers, x, repeats=1)
    assert prof[2].output_is_view and prof[2].out_bytes == 8 * 16 * 256 * 4
    assert prof[3].own_bytes == 8 * 15 * 256 * 4       # the contiguous copy it saves
    for plan in all_plans(len(layers)):
        assert planner.step_peak_bytes(plan, prof) == widgets.measure_plan_peak(layers, x, plan)
    none, least = planner.step_peak_bytes([0], prof), planner.minimum_peak(prof)
    for budget in (least, (least + none) // 2, none):
        plan = planner.plan_chain(layers, x, budget, repeats=1)
        assert widgets.measure_plan_peak(layers, x, plan.boundaries) == plan.peak_bytes <= budget


@pytest.mark.parametrize("strided, width", [(Swap, 16 * 32), (EveryOther, 8 * 32)])
def test_a_flatten_of_a_strided_input_is_counted_as_the_copy_it_makes(strided, width):
    torch.manual_seed(0)
    layers = [nn.Conv1d(4, 16, 3, padding=1), nn.Tanh(), strided(), nn.Flatten(),
              nn.Linear(width, 8)]
    x = torch.randn(16, 4, 32)
    prof = profile_layers(layers, x, repeats=1)
    assert [p.output_is_view for p in prof] == [False, False, True, False, False]
    assert prof[3].forward_peak_bytes == prof[3].out_bytes == 16 * width * 4
    for plan in all_plans(len(layers)):
        assert planner.step_peak_bytes(plan, prof) == widgets.measure_plan_peak(layers, x, plan)
