"""The planner in the allocator's bytes: `plan_chain(..., allocator=True)`.

A plan in tensor bytes bounds what `track_memory` counts; the allocator also holds operations'
temporaries (a CPU convolution's column buffers), the random generators' states every live
checkpoint keeps (and a copy while it recomputes), and Python numbers wrapped into tensors that
autograd saves. Measured here with `track_memory(allocator=True)` around the very step the
planner models: the predicted peak equals the allocator's own peak, byte for byte, for every
segmentation of a conv chain, the course's MLP, ResNet and GPT; plans never exceed their
budget; and a plan made in tensor bytes does exceed the same budget in the allocator's bytes.
"""
import dataclasses
import random

import pytest
import torch
from torch import nn

from ckpt_lab import planner, profile_layers, track_memory
from ckpt_lab.checkpoint import checkpoint, checkpoint_sequential
from ckpt_lab.training.models import build_model, get_config
from ckpt_lab.plan.step_model import StepModel
from ckpt_lab.plan.profile import _Untouched

import chains
from test_plan_step import all_plans, random_profile


def step_peaks(layers, x, boundaries) -> tuple[int, int]:
    """(tensor bytes, allocator bytes) at the peak of one planned step, model left as it was."""
    x_grad = x.grad
    try:
        with _Untouched(layers, x.device), track_memory(allocator=True) as mem:
            checkpoint_sequential(layers, x, boundaries=list(boundaries)).float().sum().backward()
    finally:
        x.grad = x_grad
    return mem.peak_bytes, mem.allocator_peak_bytes


def course_chain(preset: str):
    """A course model's chain of layers (dropout as the preset has it) and a batch for it."""
    cfg = get_config(preset)
    layers = build_model(cfg).train().layers()
    torch.manual_seed(0)
    if preset.startswith("resnet"):
        return layers, torch.randn(4, cfg.in_channels, cfg.image_size, cfg.image_size)
    return layers, torch.randint(0, cfg.vocab_size, (4, cfg.block_size))


def conv_chain():
    return chains.shrinking_convnet(), torch.randn(4, 3, 16, 16)


CHAINS = {"conv chain": conv_chain, "mlp-tiny": lambda: course_chain("mlp-tiny"),
          "resnet-tiny": lambda: course_chain("resnet-tiny"),
          "gpt-tiny": lambda: course_chain("gpt-tiny")}


def profiles(layers, x):
    """Both units, recompute cost counted in layers (timing noise picks no plan)."""
    return [[dataclasses.replace(p, forward_seconds=1.0)
             for p in profile_layers(layers, x, repeats=1, allocator=unit)]
            for unit in (False, True)]


@pytest.mark.parametrize("name", list(CHAINS))
def test_every_plan_is_predicted_exactly_in_both_units(name, one_thread):
    layers, x = CHAINS[name]()
    tensor, alloc = profiles(layers, x)
    rows = []
    for plan in all_plans(len(layers)):
        measured = step_peaks(layers, x, plan)
        predicted = (planner.step_peak_bytes(plan, tensor), planner.step_peak_bytes(plan, alloc))
        rows.append(f"{str(plan):>20} tensor {measured[0]:>8,} allocator {measured[1]:>8,}")
        assert predicted == measured, (plan, predicted, measured)
    print(f"\n{name}: every plan, measured = predicted\n" + "\n".join(rows))


@pytest.mark.parametrize("name", list(CHAINS))
def test_allocator_plans_fit_their_budget_where_tensor_plans_do_not(name, one_thread):
    layers, x = CHAINS[name]()
    tensor, alloc = profiles(layers, x)
    least, none = planner.minimum_peak(alloc), planner.step_peak_bytes([0], alloc)
    assert least < none
    over = []
    for budget in sorted({least, (2 * least + none) // 3, (least + 2 * none) // 3, none}):
        plan = planner.optimal_segments(alloc, budget)
        assert step_peaks(layers, x, plan.boundaries)[1] == plan.peak_bytes <= budget
        # the same budget read as tensor bytes leaves room the allocator does not have
        naive = planner.optimal_segments(tensor, budget)
        naive_peak = step_peaks(layers, x, naive.boundaries)[1]
        if naive_peak > budget:
            over.append((budget, naive.boundaries, naive_peak, plan.boundaries, plan.peak_bytes))
    print(f"\n{name}: (budget, tensor-bytes plan, its allocator peak, allocator plan, its peak)",
          *over, sep="\n")
    assert over and over[0][0] == least   # at the tightest budget, always


def test_plan_chain_plans_in_either_unit(one_thread):
    layers, x = conv_chain()
    least = planner.minimum_peak(profile_layers(layers, x, repeats=1, allocator=True))
    plan = planner.plan_chain(layers, x, least, repeats=1, allocator=True)
    assert step_peaks(layers, x, plan.boundaries)[1] == plan.peak_bytes <= least
    with pytest.raises(planner.BudgetTooSmallError):
        planner.plan_chain(layers, x, least - 1, repeats=1, allocator=True)
    # in tensor bytes the same number is roomy: no checkpoint at all, which the allocator exceeds
    naive = planner.plan_chain(layers, x, least, repeats=1)
    tensor_peak, allocator_peak = step_peaks(layers, x, naive.boundaries)
    assert naive.peak_bytes == tensor_peak <= least < allocator_peak


def test_what_only_the_allocator_sees_is_measured(one_thread):
    """The two pieces the tracker cannot see, measured for the course's GPT: the generator
    state each checkpoint keeps, and the wrapped Python number autograd saves past the hooks
    (the attention's ``* (1.0 / math.sqrt(d))``, a float64 scalar)."""
    layers, x = course_chain("gpt-tiny")
    tensor, alloc = profiles(layers, x)
    assert all(not p.allocator and p.checkpoint_state_bytes == p.unhooked_bytes == 0
               for p in tensor)
    state = torch.get_rng_state().untyped_storage().nbytes()
    assert all(p.allocator and p.checkpoint_state_bytes == state for p in alloc)
    scalar = torch.empty((), dtype=torch.float64).element_size()
    assert [p.unhooked_bytes for p in alloc] == [0] + [scalar] * (len(layers) - 2) + [0]
    # a checkpointed block, after its forward, holds exactly these beyond tracked storages
    block = layers[1]
    h = layers[0](x).detach().requires_grad_()
    with _Untouched(layers, x.device), track_memory(allocator=True) as mem:
        out = checkpoint(block, h)
    assert mem.allocator_current_bytes - mem.current_bytes == state + scalar
    del out
    # and a budget in allocator bytes counts both (and the operations' temporaries)
    assert planner.step_peak_bytes([0, 1, 2, 3], alloc) > planner.step_peak_bytes([0, 1, 2, 3],
                                                                                   tensor)


def with_allocator_pieces(rng, prof):
    """A random profile given the two allocator-only pieces (generator states, unhooked)."""
    return [dataclasses.replace(p, allocator=True, checkpoint_state_bytes=rng.choice([0, 7, 13]),
                                unhooked_bytes=rng.choice([0, 0, 2, 5])) for p in prof]


def test_planner_tables_equal_the_readable_model_with_allocator_pieces():
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 9)
        model = StepModel(with_allocator_pieces(rng, random_profile(rng, n)))
        tables = model.tables()
        for a in range(n - 1):
            for b in range(a + 1, n):
                forbidden = model.input_writer[a] is not None
                assert tables.segment[a, b] == (float("inf") if forbidden
                                                else model.segment_peak(a, b))
                assert tables.kept[a, b] == model.kept(a, b)
        assert list(tables.last) == [model.last_segment_peak(t) for t in range(n)]


def test_allocator_planner_matches_brute_force():
    rng = random.Random(6)
    checked = 0
    for _ in range(80):
        n = rng.randint(1, 8)
        prof = with_allocator_pieces(rng, random_profile(rng, n))
        model = StepModel(prof)
        plans = []
        for p in all_plans(n):
            if all(model.input_writer[a] is None for a in p[:-1]):
                plans.append(planner.evaluate_plan(p, prof))
        for budget in sorted({q.peak_bytes for q in plans}):
            best = planner.optimal_segments(prof, budget)
            fits = [q for q in plans if q.peak_bytes <= budget]
            cheapest = min(q.recompute_cost for q in fits)
            assert best.peak_bytes <= budget and best.recompute_cost == cheapest
            assert best.peak_bytes == min(q.peak_bytes for q in fits
                                          if q.recompute_cost == cheapest)
            checked += 1
    assert checked > 100


def test_a_profile_in_two_units_is_refused():
    rng = random.Random(7)
    prof = random_profile(rng, 4)
    mixed = prof[:2] + with_allocator_pieces(rng, prof[2:])
    with pytest.raises(ValueError, match="mixes units"):
        planner.step_peak_bytes([0], mixed)


class Stateful(nn.Module):
    """A learner's layer with state: a call counter and a running mean its forward updates in
    place, a persistent scale it only reads (the multiply saves it), and a non-persistent
    cache (no state: never copied)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("scale", torch.full((d,), 0.5))
        self.register_buffer("cache", torch.zeros(d), persistent=False)

    def forward(self, x):
        self.calls += 1
        h = torch.tanh(self.lin(x))
        with torch.no_grad():
            self.mean.mul_(0.9).add_(h.mean(0), alpha=0.1)
        return h * self.scale + self.cache


def stateful_chain():
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU()), Stateful(32),
              Stateful(32), nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.Tanh()),
              Stateful(32), nn.Linear(32, 4)]
    return layers, torch.randn(16, 8)


def test_the_replay_of_module_state_is_measured_per_layer(one_thread):
    """What ckpt_lab.checkpoint copies to replay module state (module_state), read off a
    checkpointed run of each layer alone: the same in both units on CPU, and what the state
    does for a batch norm and for the learner's layer above."""
    layers, x = stateful_chain()
    tensor, alloc = profiles(layers, x)
    pieces = lambda p: (p.buffer_copy_bytes, p.changed_buffer_bytes,  # noqa: E731
                        p.recompute_buffer_bytes, p.recompute_saved_buffer_bytes)
    assert [pieces(p) for p in tensor] == [pieces(p) for p in alloc]
    f, long = 4, 8
    # batch norm: copies of both statistics and the counter at entry; the counter (changed)
    # kept; the counter and the statistics (saved) copied for the recompute, which saves those
    bn = (2 * 32 * f + long, long, 2 * 32 * f + long, 2 * 32 * f)
    # the learner's layer: calls, mean, scale at entry (not the cache); calls and mean
    # (changed) kept; those and scale (saved) copied for the recompute, which saves scale
    mine = (long + 2 * 32 * f, long + 32 * f, long + 2 * 32 * f, 32 * f)
    assert [pieces(p) for p in tensor] == [bn, mine, mine, bn, mine, (0, 0, 0, 0)]
    # the recompute's saved copies are among what it saves, and what its backward holds
    assert all(p.recompute_own_bytes - p.own_bytes == p.recompute_saved_buffer_bytes
               for p in tensor)


def test_a_learners_module_with_buffers_is_predicted_exactly_in_both_units(one_thread):
    layers, x = stateful_chain()
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in layers]
    objects = [[b for b in m.buffers()] for m in layers]
    tensor, alloc = profiles(layers, x)
    for m, state, objs in zip(layers, before, objects):   # profiling left the model alone
        assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
        assert all(a is b for a, b in zip(m.buffers(), objs))
    for plan in all_plans(len(layers)):
        measured = step_peaks(layers, x, plan)
        predicted = (planner.step_peak_bytes(plan, tensor), planner.step_peak_bytes(plan, alloc))
        assert predicted == measured, (plan, predicted, measured)
    least, none = planner.minimum_peak(alloc), planner.step_peak_bytes([0], alloc)
    for budget in (least, (least + none) // 2):
        plan = planner.optimal_segments(alloc, budget)
        assert len(plan.boundaries) > 1
        assert step_peaks(layers, x, plan.boundaries)[1] == plan.peak_bytes <= budget
