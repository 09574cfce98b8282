"""The plan explorer and `measure_plan_peak` (lessons 6 and 10), driven headlessly: set a slider,
read the measured result."""
import torch
from torch import nn

from ckpt_lab import checkpoint_sequential, planner, profile_layers, track_memory
from ckpt_lab.lessons import widgets


def _chain():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64), nn.ReLU(),
                         nn.Linear(64, 8))


def test_plan_explorer_follows_the_budget_slider():
    layers, x = _chain(), torch.randn(64, 16)
    e = widgets.plan_explorer(layers, x, budget_fraction=1.0)
    loose = e.result
    assert loose.boundaries == [0]                 # everything fits: no checkpoint
    image = e.image.value
    e.sliders["budget"].value = e.sliders["budget"].min
    tight = e.result
    assert e.image.value != image                  # the figure was redrawn
    assert tight.peak_bytes < loose.peak_bytes     # the plan really lowered the measured peak
    assert tight.recompute_cost > 0
    for r in (loose, tight):
        # the step model predicts the measured step peak, and the plan fits its budget
        assert r.peak_bytes <= r.budget_bytes and r.predicted_bytes <= r.budget_bytes
        assert abs(r.ratio - 1) <= 0.03, r


def test_plan_explorer_plans_on_the_cost_it_is_given():
    """With cost= (e.g. FLOPs) the explorer plans, draws and reports on that cost, not on time."""
    from ckpt_lab import planner
    layers, x = _chain(), torch.randn(64, 16)
    prof = profile_layers(layers, x, repeats=1)
    cost = [sum(p.numel() for p in layer.parameters()) for layer in layers]   # ReLUs cost 0
    e = widgets.plan_explorer(layers, x, budget_fraction=0.0, profile=prof, cost=cost, basis="FLOPs")
    r = e.result
    want = planner.optimal_segments(prof, r.budget_bytes, fwd_cost=cost)
    assert r.boundaries == want.boundaries and r.recompute_cost == want.recompute_cost
    assert r.forward_cost == sum(cost) and "forward's FLOPs" in e.text.value


def test_measure_plan_peak_matches_a_direct_measurement():
    layers, x = _chain(), torch.randn(64, 16)
    prof = profile_layers(layers, x, repeats=1)
    act, out = [p.act_bytes for p in prof], [p.out_bytes for p in prof]
    budget = max(0.5 * sum(act), planner.minimum_peak(act, out))
    plan = planner.optimal_segments(act, out, [1.0] * len(prof), budget)
    assert len(plan.boundaries) > 1
    got = widgets.measure_plan_peak(layers, x, plan.boundaries)
    with track_memory() as log:
        checkpoint_sequential(layers, x, boundaries=plan.boundaries).float().sum().backward()
    # the direct run allocates parameter gradients inside the block, so it is larger
    params = sum(p.numel() * p.element_size() for p in layers.parameters())
    assert got <= log.peak_bytes <= got + params + 64 * 64 * 4



def test_measure_plan_counts_the_allocator_as_plan_chain_predicts_it(one_thread):
    """measure_plan(allocator=True): the same step in tensor bytes and in the allocator's, the
    latter what plan_chain(..., allocator=True) plans for (exact on CPU for a chain without
    module buffers, which ckpt_lab's checkpoint would copy)."""
    layers, x = _chain(), torch.randn(64, 16)
    prof = profile_layers(layers, x, repeats=1, allocator=True)
    plan = planner.optimal_segments(prof, planner.minimum_peak(prof))
    assert len(plan.boundaries) > 1
    log = widgets.measure_plan(layers, x, plan.boundaries, allocator=True)
    assert log.peak_bytes == widgets.measure_plan_peak(layers, x, plan.boundaries)
    assert log.allocator_peak_bytes == plan.peak_bytes > log.peak_bytes
    assert widgets.measure_plan(layers, x, plan.boundaries).allocator_peak_bytes is None

def test_measure_plan_peak_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Dropout(0.5), nn.ReLU(),
                           nn.Linear(32, 8))
    x = torch.randn(64, 16, requires_grad=True)
    layers[0].weight.grad = torch.ones_like(layers[0].weight)     # the user's own gradient
    stats = layers[1].running_mean.clone(), layers[1].num_batches_tracked.clone()
    rng = torch.get_rng_state()
    peaks = [widgets.measure_plan_peak(layers, x, [0, 2]) for _ in range(2)]
    assert peaks[0] == peaks[1] > 0
    assert torch.equal(layers[0].weight.grad, torch.ones_like(layers[0].weight))
    assert layers[4].weight.grad is None and x.grad is None
    assert torch.equal(layers[1].running_mean, stats[0])
    assert torch.equal(layers[1].num_batches_tracked, stats[1])
    assert torch.equal(torch.get_rng_state(), rng)
