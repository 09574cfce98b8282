"""The planner: exact against brute force, fast on long chains, and right on a real model."""
import itertools
import random

import pytest
import torch
from torch import nn

from ckpt_lab import checkpoint_sequential, profile_layers, track_memory
from ckpt_lab.plan.planner import (BudgetTooSmallError, Plan, evaluate_plan, minimum_peak,
                              optimal_segments, pareto_front, uniform_plan)


def all_plans(n):
    for k in range(n):
        for rest in itertools.combinations(range(1, n), k):
            yield [0, *rest]


def brute_force(act, out, cost, budget, input_bytes=0):
    """Least cost, then least peak, over every plan; None if none fits."""
    plans = [evaluate_plan(p, act, out, cost, input_bytes) for p in all_plans(len(act))]
    fits = [p for p in plans if p.peak_bytes <= budget]
    if not fits:
        return None, min(p.peak_bytes for p in plans)
    return min(fits, key=lambda p: (p.recompute_cost, p.peak_bytes)), None


def random_chain(rng, n):
    act = [rng.randint(0, 50) for _ in range(n)]
    out = [rng.randint(0, 20) for _ in range(n)]
    cost = [rng.choice([0, 1, 2, 3, 0.5]) for _ in range(n)]
    return act, out, cost, rng.randint(0, 20)


def test_matches_brute_force_on_every_plan_up_to_12_layers():
    rng = random.Random(0)
    checked = 0
    for n in list(range(1, 13)) + [12, 11, 10, 9]:
        act, out, cost, inp = random_chain(rng, n)
        plans = [evaluate_plan(p, act, out, cost, inp) for p in all_plans(n)]
        peaks = sorted({p.peak_bytes for p in plans})
        budgets = set(rng.sample(peaks, min(4, len(peaks)))) | {peaks[0], peaks[0] - 1,
                                                               peaks[-1], peaks[-1] + 5}
        for budget in sorted(b for b in budgets if b >= 0):
            want, minimum = brute_force(act, out, cost, budget, inp)
            if want is None:
                with pytest.raises(BudgetTooSmallError) as err:
                    optimal_segments(act, out, cost, budget, inp)
                assert err.value.minimum_bytes == minimum
                assert f"{minimum:,}" in str(err.value)
                continue
            got = optimal_segments(act, out, cost, budget, input_bytes=inp)
            assert (got.recompute_cost, got.peak_bytes) == (want.recompute_cost,
                                                             want.peak_bytes), (act, out, budget)
            assert got == evaluate_plan(got.boundaries, act, out, cost, inp)
            assert got.peak_bytes <= budget
            checked += 1
        assert minimum_peak(act, out, cost, inp) == peaks[0]
    assert checked > 50


def test_pareto_front_matches_brute_force():
    rng = random.Random(1)
    for n in (1, 3, 6, 9):
        act, out, cost, inp = random_chain(rng, n)
        cost = [c + 1 for c in cost]  # strictly positive: one plan per cost level
        plans = [evaluate_plan(p, act, out, cost, inp) for p in all_plans(n)]
        want = []
        for p in sorted(plans, key=lambda p: (p.peak_bytes, p.recompute_cost)):
            if not want or p.recompute_cost < want[-1][1]:
                want.append((p.peak_bytes, p.recompute_cost))
        got = pareto_front(act, out, cost, inp)
        assert [(p.peak_bytes, p.recompute_cost) for p in got] == want
        assert got[-1].boundaries == [0] and got[-1].recompute_cost == 0


def test_plans_a_thousand_layers():
    """A long chain plans, exactly (its time is benchmarks/bench_planner.py's)."""
    rng = random.Random(2)
    n = 1000
    act = [rng.randint(1_000, 100_000) for _ in range(n)]
    out = [rng.randint(100, 10_000) for _ in range(n)]
    cost = [rng.uniform(0.5, 2.0) for _ in range(n)]
    minimum = minimum_peak(act, out, cost)
    plan = optimal_segments(act, out, cost, budget_bytes=minimum * 2)
    assert plan.peak_bytes <= minimum * 2
    assert plan == evaluate_plan(plan.boundaries, act, out, cost)
    # a tighter budget can only cost more recompute
    tighter = optimal_segments(act, out, cost, budget_bytes=minimum)
    assert tighter.peak_bytes == minimum and tighter.recompute_cost >= plan.recompute_cost


def test_generous_budget_means_no_checkpoint_and_uniform_chain_sqrt_shape():
    act, out = [10] * 16, [10] * 16
    assert optimal_segments(act, out, [1] * 16, float("inf")) == Plan([0], 160, 0)
    assert optimal_segments(act, out, [1] * 16, 160).boundaries == [0]
    tight = minimum_peak(act, out, input_bytes=10)
    plan = optimal_segments(act, out, [1] * 16, tight, input_bytes=10)
    uniform = min(evaluate_plan(uniform_plan(16, s), act, out, [1] * 16, 10).peak_bytes
                  for s in range(1, 17))
    assert uniform == 70  # 4 segments of 4: 3 kept inputs + 4 layers
    # unequal segments beat every uniform split: e.g. sizes 4, 5, 4, 3 peak at 40, 60, 60, 60
    assert plan.peak_bytes == tight == 60
    assert plan.recompute_cost == 13  # 3 kept inputs leave room for a last segment of 3


def test_uniform_plan_matches_checkpoint_sequential_semantics():
    assert uniform_plan(10, 3) == [0, 3, 6]  # last segment takes the remainder: 6..9
    assert uniform_plan(7, 7) == list(range(7))
    assert uniform_plan(5, 1) == [0]
    for bad in [(0, 1), (5, 0), (5, 6), (5, 1.5)]:
        with pytest.raises(ValueError):
            uniform_plan(*bad)


def test_evaluate_plan_by_hand():
    act, out, cost = [4, 5, 6, 7], [1, 2, 3, 4], [1, 1, 2, 2]
    plan = evaluate_plan([0, 2, 3], act, out, cost, input_bytes=9)
    # segments [0,2) kept 9, [2,3) kept out[1]=2, last [3,4): peaks 9, 9+6, 9+2+7
    assert plan == Plan([0, 2, 3], 18, 4)


@pytest.mark.parametrize("args, match", [
    (([], [], [], 10), "empty"),
    (([1, 2], [1], [1, 1], 10), "one entry per layer"),
    (([1, -2], [1, 1], [1, 1], 10), "act_bytes"),
    (([1, 2.5], [1, 1], [1, 1], 10), "whole number"),
    (([1, 2], [1, 1], [1, float("nan")], 10), "fwd_cost"),
    (([1, 2], [1, 1], [1, 1], -1), "budget_bytes"),
    (([1, 2], [1, 1], [1, 1], "big"), "budget_bytes"),
])
def test_bad_inputs_raise_clear_value_errors(args, match):
    with pytest.raises(ValueError, match=match):
        optimal_segments(*args)


def test_budget_below_minimum_names_the_minimum():
    with pytest.raises(BudgetTooSmallError, match="least peak") as err:
        optimal_segments([10, 10, 10], [1, 1, 1], [1, 1, 1], budget_bytes=5)
    assert isinstance(err.value, ValueError) and err.value.minimum_bytes == 11
    with pytest.raises(ValueError, match="begin with 0"):
        evaluate_plan([1, 2], [1, 1, 1], [1, 1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="increasing"):
        evaluate_plan([0, 2, 2], [1, 1, 1], [1, 1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="input_bytes"):
        minimum_peak([1], [1], input_bytes=-3)


def unequal_mlp(widths, seed=0):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers)


def measured_peak(model, x, boundaries):
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # model state lives outside the measurement
    with track_memory() as mem:
        checkpoint_sequential(model, x, boundaries=boundaries).sum().backward()
    return mem.peak_bytes


def backward_transient_bytes(model, batch):
    """Most gradient bytes alive at once in one (Linear, Tanh) backward, none of which the plan
    counts: the grad arriving at Tanh, the grad it passes to Linear (both out-wide), then the
    Linear's input, weight and bias grads."""
    return max((batch * (m.in_features + 2 * m.out_features) + m.weight.numel()
                + m.bias.numel()) * 4 for m in model if isinstance(m, nn.Linear))


def test_planned_peak_matches_measured_on_an_mlp_with_unequal_widths():
    widths = [32, 256, 48, 192, 32, 224, 64, 160, 32, 256, 40]
    model = unequal_mlp(widths)
    batch = 512
    x = torch.randn(batch, widths[0], requires_grad=True)
    profile = profile_layers(model, x, repeats=1)
    act = [p.act_bytes for p in profile]
    out = [p.out_bytes for p in profile]
    cost = [p.forward_seconds for p in profile]
    inp = x.numel() * x.element_size()
    minimum = minimum_peak(act, out, cost, inp)
    none = evaluate_plan([0], act, out, cost, inp)
    # What the plan's model leaves out: the gradients of one layer's backward, and the input
    # of the segment being processed (profile_layers books it to the layer before, which
    # saved it first, so no segment's own sum counts it).
    slack = backward_transient_bytes(model, batch) + max(out)
    for budget in (minimum, (minimum + none.peak_bytes) // 2, none.peak_bytes):
        plan = optimal_segments(act, out, cost, budget, input_bytes=inp)
        measured = measured_peak(model, x, plan.boundaries)
        assert plan.peak_bytes <= measured <= plan.peak_bytes + slack, (plan, measured, slack)
    tight = optimal_segments(act, out, cost, minimum, input_bytes=inp)
    assert measured_peak(model, x, tight.boundaries) < 0.6 * measured_peak(model, x, [0])


def test_numpy_numbers_are_numbers():
    """A budget or byte counts computed with numpy (np.int64, np.float64) plan like ints."""
    np = pytest.importorskip("numpy")
    act, out, cost = [4, 5, 6, 7], [1, 2, 3, 4], [1, 1, 2, 2]
    plain = optimal_segments(act, out, cost, 18, input_bytes=9)
    assert optimal_segments(np.array(act), np.array(out), np.array(cost, dtype=np.float64),
                            np.int64(18), input_bytes=np.int64(9)) == plain
    assert uniform_plan(np.int64(4), np.int64(2)) == uniform_plan(4, 2)
    assert minimum_peak(act, out, cost, np.int64(9)) == minimum_peak(act, out, cost, 9)
