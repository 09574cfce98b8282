"""The step model: exact on random chains, fast on long ones, and what a real step measures.

`planner.step_peak_bytes` must predict `widgets.measure_plan_peak` (one step of
`checkpoint_sequential` + `.float().sum().backward()`, parameter gradients allocated before)
byte for byte on CPU, on the course's chains and on chains of PyTorch's own modules (batch
norms included: the copies of module buffers the checkpoint makes to replay them are in the
model), and the planner's plans must measure within their budget.
"""
import itertools
import random

import pytest
import torch
from torch import nn

from ckpt_lab import planner, profile_layers
from ckpt_lab.plan import profile
from ckpt_lab.lessons import widgets
from ckpt_lab.training.models import (Block, ConvBNReLU, Embed, GPTConfig, LMHead, MLPBlock,
                                      PoolHead, ResBlock)
from ckpt_lab.plan.profile import LayerProfile
from ckpt_lab.plan.step_model import StepModel

import chains


def all_plans(n):
    for k in range(n):
        for rest in itertools.combinations(range(1, n), k):
            yield [0, *rest]


def random_profile(rng, n):
    """Random but consistent pieces: peaks at least what is alive when they happen."""
    out = []
    for i in range(n):
        own, o, gin = rng.randint(0, 30), rng.randint(0, 20), rng.randint(0, 20)
        saves = rng.random() < 0.85
        fwd = own + o + rng.randint(0, 20)
        bwd = own + gin + rng.randint(0, 30)
        extra = rng.choice([0, 0, 3])
        view = rng.random() < 0.15
        # the module-state replay's buffer copies: at a checkpointed forward's entry, kept
        # (changed), made for the recompute, and saved by it (part of its saved bytes)
        copy = rng.choice([0, 0, 0, 8, 24])
        changed = rng.choice([0, min(copy, 8)])
        rcopy = rng.choice([0, copy]) if saves else 0
        rsaved = rng.choice([0, rcopy // 2])
        extra += rsaved
        out.append(LayerProfile(
            str(i), own, o, rng.choice([0, 1, 2, 0.5]), bwd - own, own,
            saves_input=saves and rng.random() < 0.6, saves_output=saves and rng.random() < 0.5,
            saves_any=saves, forward_peak_bytes=fwd, free_forward_peak_bytes=rng.randint(o, o + 20),
            backward_peak_bytes=bwd, held_backward_peak_bytes=bwd + rng.randint(0, 10),
            grad_in_bytes=gin, recompute_own_bytes=own + extra,
            recompute_forward_peak_bytes=fwd + extra + rcopy - rsaved,
            recompute_peak_bytes=rng.randint(rcopy, fwd + extra + rcopy - rsaved) if saves else 0,
            recompute_backward_peak_bytes=bwd + extra,
            recompute_held_backward_peak_bytes=bwd + extra + rng.randint(0, 10),
            output_is_view=view, writes_input=rng.random() < (0.5 if view else 0.03),
            buffer_copy_bytes=copy, changed_buffer_bytes=changed, recompute_buffer_bytes=rcopy,
            recompute_saved_buffer_bytes=rsaved))
    return out


def test_planner_tables_equal_the_readable_model():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        model = StepModel(random_profile(rng, n))
        tables = model.tables()
        for a in range(n - 1):
            for b in range(a + 1, n):
                forbidden = model.input_writer[a] is not None   # a layer writes the kept input
                assert tables.segment[a, b] == (float("inf") if forbidden
                                                else model.segment_peak(a, b))
                assert tables.kept[a, b] == model.kept(a, b)
        assert list(tables.last) == [model.last_segment_peak(t) for t in range(n)]


def test_step_planner_matches_brute_force():
    rng = random.Random(1)
    checked = refused = 0
    for _ in range(120):
        n = rng.randint(1, 9)
        prof = random_profile(rng, n)
        plans = []
        for p in all_plans(n):
            # a checkpointed segment may not start where a layer writes its kept input
            writer = [next((i for i in range(a, n) if prof[i].writes_input
                            and all(q.output_is_view for q in prof[a:i])), None) for a in p[:-1]]
            if any(w is not None for w in writer):
                with pytest.raises(ValueError, match="writes its input in place"):
                    planner.evaluate_plan(p, prof)
                refused += 1
                continue
            plans.append(planner.evaluate_plan(p, prof))
        assert all(p.peak_bytes == planner.step_peak_bytes(p.boundaries, prof) for p in plans)
        peaks = sorted({p.peak_bytes for p in plans})
        for budget in set(rng.sample(peaks, min(3, len(peaks)))) | {peaks[0] - 1, peaks[-1]}:
            fits = [p for p in plans if p.peak_bytes <= budget]
            if not fits:
                with pytest.raises(planner.BudgetTooSmallError) as err:
                    planner.optimal_segments(prof, budget)
                assert err.value.minimum_bytes == peaks[0] == planner.minimum_peak(prof)
                continue
            want = min(fits, key=lambda p: (p.recompute_cost, p.peak_bytes))
            got = planner.optimal_segments(prof, budget)
            assert (got.recompute_cost, got.peak_bytes) == (want.recompute_cost, want.peak_bytes)
            checked += 1
        front = planner.pareto_front(prof)
        for p in front:   # nothing on the front is beaten on both peak and recompute
            assert not any(q.peak_bytes <= p.peak_bytes and q.recompute_cost <= p.recompute_cost
                           and (q.peak_bytes, q.recompute_cost) != (p.peak_bytes, p.recompute_cost)
                           for q in plans)
    assert checked > 200 and refused > 50


def test_a_thousand_layer_profile_plans():
    """A long profile plans, exactly (its time is benchmarks/bench_planner.py's)."""
    rng = random.Random(2)
    prof = random_profile(rng, 1000)
    for p in prof:
        p.forward_seconds = rng.uniform(0.5, 2.0)
    budget = int(1.3 * planner.minimum_peak(prof))
    prof = [dataclass_replace(p) for p in prof]          # a fresh profile: no cached tables
    plan = planner.optimal_segments(prof, budget)
    assert plan.peak_bytes <= budget < planner.step_peak_bytes([0], prof)
    assert len(plan.boundaries) > 10
    assert plan.peak_bytes == planner.step_peak_bytes(plan.boundaries, prof)


# ------------------------------------------------------------------- chains, measured
def mlp():
    torch.manual_seed(0)
    widths = [32, 256, 48, 192, 32, 224, 64, 160, 40]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Sequential(nn.Linear(a, b), nn.Tanh())]
    return layers, torch.randn(128, 32)


def mlp_blocks():
    torch.manual_seed(0)
    return [MLPBlock(64, dropout=0.1) for _ in range(8)], torch.randn(128, 64, requires_grad=True)


def gpt():
    torch.manual_seed(0)
    c = GPTConfig(block_size=16, n_layer=4, n_head=2, n_embd=32, dropout=0.1)
    return [Embed(c)] + [Block(c) for _ in range(4)] + [LMHead(c)], torch.randint(0, 256, (4, 16))


def shrinking_convnet():
    return chains.shrinking_convnet(), torch.randn(4, 3, 16, 16)


def resnet():
    torch.manual_seed(0)
    return [ConvBNReLU(3, 8)] + [ResBlock(8) for _ in range(4)] + [PoolHead(8, 10)], \
        torch.randn(4, 3, 8, 8)


def torch_encoder():
    torch.manual_seed(0)
    return [nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
            for _ in range(5)], torch.randn(4, 12, 32)


def bottleneck_mlp():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(64, 256), nn.GELU()), nn.Sequential(nn.Linear(256, 16), nn.ReLU()),
            nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Dropout(0.1)),
            nn.Sequential(nn.Linear(256, 16), nn.LayerNorm(16)),
            nn.Sequential(nn.Linear(16, 128), nn.SiLU()), nn.Linear(128, 8)], torch.randn(64, 64)


CHAINS = [mlp, mlp_blocks, gpt, shrinking_convnet, resnet, torch_encoder, bottleneck_mlp]


@pytest.mark.parametrize("make", CHAINS, ids=lambda f: f.__name__)
def test_plans_measure_exactly_and_within_budget(make, one_thread):
    layers, x = make()
    prof = profile_layers(layers, x, repeats=1)
    prof = [dataclass_replace(p, forward_seconds=1.0) for p in prof]   # recompute in layers
    n = len(layers)
    none = planner.step_peak_bytes([0], prof)
    least = planner.minimum_peak(prof)
    assert least < none
    rows = []
    for budget in sorted({least, (2 * least + none) // 3, (least + 2 * none) // 3, none}):
        plan = planner.optimal_segments(prof, budget)
        measured = widgets.measure_plan_peak(layers, x, plan.boundaries)
        rows.append((plan.boundaries, measured))
        assert measured == plan.peak_bytes <= budget, (plan, measured, budget)
        if n <= 8:   # no plan beats the returned one on both peak and recompute
            for other in all_plans(n):
                q = planner.evaluate_plan(other, prof)
                assert not (q.peak_bytes <= plan.peak_bytes and q.recompute_cost < plan.recompute_cost)
                assert not (q.peak_bytes < plan.peak_bytes and q.recompute_cost <= plan.recompute_cost)
    print(make.__name__, "plans and their measured (= predicted) peaks:", rows)


def dataclass_replace(p, **kw):
    import dataclasses
    return dataclasses.replace(p, **kw)


@pytest.mark.parametrize("make", [torch_encoder, shrinking_convnet, resnet],
                         ids=lambda f: f.__name__)
def test_every_plan_is_predicted_exactly(make, one_thread):
    """PyTorch's encoder layers, and conv chains with batch norms (nn.BatchNorm2d, whose
    recompute saves the checkpoint's copies of its statistics, and the course's
    RecomputeSafeBatchNorm2d, whose recompute saves copies of its own)."""
    layers, x = make()
    prof = profile_layers(layers, x, repeats=1)
    for plan in all_plans(len(layers)):
        measured = widgets.measure_plan_peak(layers, x, plan)
        predicted = planner.step_peak_bytes(plan, prof)
        assert measured == predicted, (plan, measured, predicted)


def test_plan_chain_profiles_plans_and_names_the_minimum(one_thread):
    layers, x = bottleneck_mlp()
    loose = planner.plan_chain(layers, x, budget_bytes=10**9, repeats=1)
    assert loose.boundaries == [0] and loose.recompute_cost == 0
    assert widgets.measure_plan_peak(layers, x, [0]) == loose.peak_bytes
    with pytest.raises(planner.BudgetTooSmallError) as err:
        planner.plan_chain(layers, x, budget_bytes=1_000, repeats=1)
    least = err.value.minimum_bytes
    assert f"{least:,}" in str(err.value)
    tight = planner.plan_chain(layers, x, budget_bytes=least, repeats=1)
    assert tight.peak_bytes == least and len(tight.boundaries) > 1
    assert widgets.measure_plan_peak(layers, x, tight.boundaries) == least


def test_profile_leaves_grads_batchnorm_statistics_and_rng_alone():
    layers, x = shrinking_convnet()
    model = nn.Sequential(*layers).train()
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    grads = {name: p.grad for name, p in model.named_parameters()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)
    profile_layers(model, x, repeats=2)
    after_rng = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(after_rng, torch.rand(3))          # the generator did not advance
    for name, p in model.named_parameters():
        assert p.grad is grads[name] and bool((p.grad == 7).all())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k                 # running stats, num_batches_tracked


def test_backward_work_bytes_leaves_grad_alone():
    torch.manual_seed(0)
    lin = nn.Linear(8, 32)
    lin.weight.grad = torch.ones_like(lin.weight)
    kept = lin.weight.grad
    profile.backward_work_bytes([lin], torch.randn(16, 8))
    assert lin.weight.grad is kept and bool((kept == 1).all()) and lin.bias.grad is None


def test_step_model_needs_a_measured_profile():
    hand = [LayerProfile("0", 10, 10, 1.0), LayerProfile("1", 10, 10, 1.0)]
    with pytest.raises(ValueError, match="profile_layers"):
        planner.step_peak_bytes([0], hand)
    with pytest.raises(ValueError, match="input_bytes"):
        planner.optimal_segments(random_profile(random.Random(0), 3), 100, input_bytes=5)


def costed_profiles(rng, count):
    """Random profiles, each with a cost per layer (FLOPs, say) and the same profile whose
    forward seconds are those costs."""
    for _ in range(count):
        prof = random_profile(rng, rng.randint(2, 8))
        flops = [rng.randint(0, 100) for _ in prof]
        yield prof, flops, [dataclass_replace(p, forward_seconds=f) for p, f in zip(prof, flops)]


def test_a_profile_plans_on_the_cost_it_is_given():
    """fwd_cost replaces the profiled forward seconds (FLOPs do not jitter); it was ignored before."""
    rng, checked = random.Random(3), 0
    for prof, flops, as_seconds in costed_profiles(rng, 40):
        peaks = set()
        for q in all_plans(len(prof)):
            try:
                peaks.add(planner.evaluate_plan(q, prof).peak_bytes)
            except ValueError:                      # a boundary where a layer writes in place
                pass
        for budget in sorted(peaks)[:3] + sorted(peaks)[-1:]:
            try:
                want = planner.optimal_segments(as_seconds, budget)
            except (planner.BudgetTooSmallError, ValueError):
                continue
            got = planner.optimal_segments(prof, budget, fwd_cost=flops)
            assert (got.boundaries, got.peak_bytes, got.recompute_cost) == \
                (want.boundaries, want.peak_bytes, want.recompute_cost)
            checked += want.recompute_cost != planner.optimal_segments(prof, budget).recompute_cost
    assert checked > 10                              # the cost given changed the plan's cost


def test_the_pareto_front_follows_the_cost_it_is_given():
    for prof, flops, as_seconds in costed_profiles(random.Random(3), 40):
        assert [(q.boundaries, q.recompute_cost) for q in planner.pareto_front(prof, fwd_cost=flops)] == \
            [(q.boundaries, q.recompute_cost) for q in planner.pareto_front(as_seconds)]


def test_no_checkpoint_recomputes_nothing_whatever_the_cost():
    for prof, flops, _ in costed_profiles(random.Random(3), 40):
        assert planner.evaluate_plan([0], prof, fwd_cost=flops).recompute_cost == 0


def test_an_iterator_of_costs_plans_as_its_list_does():
    prof, flops, _ = next(costed_profiles(random.Random(3), 1))
    as_list = planner.optimal_segments(prof, 10**9, fwd_cost=flops)
    as_iterator = planner.optimal_segments(prof, 10**9, fwd_cost=iter(flops))   # read once
    assert (as_iterator.boundaries, as_iterator.recompute_cost) == \
        (as_list.boundaries, as_list.recompute_cost)


def test_the_cost_needs_one_entry_per_layer():
    prof, _, _ = next(costed_profiles(random.Random(3), 1))
    with pytest.raises(ValueError, match="one entry per layer"):
        planner.optimal_segments(prof, 10**9, fwd_cost=[1])


def test_a_profile_takes_no_out_bytes():
    prof, _, _ = next(costed_profiles(random.Random(3), 1))
    with pytest.raises(ValueError, match="no out_bytes"):
        planner.evaluate_plan([0], prof, [1] * len(prof))


def test_profile_without_the_step_fields_agrees_on_the_activation_model():
    layers, x = bottleneck_mlp()
    full, light = profile_layers(layers, x, repeats=1), profile_layers(layers, x, repeats=1,
                                                                        step=False)
    assert [(p.act_bytes, p.out_bytes) for p in full] == [(p.act_bytes, p.out_bytes) for p in light]
    assert light[0].work_bytes is None
    with pytest.raises(ValueError, match="profile_layers"):
        planner.optimal_segments(light, 10**9)


def test_a_layer_that_returns_a_view_of_its_input(one_thread):
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()),
              nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()),
              nn.Flatten(), nn.Linear(8 * 64, 32), nn.ReLU(), nn.Linear(32, 10)]
    x = torch.randn(4, 3, 8, 8)
    prof = profile_layers(layers, x, repeats=1)
    assert [p.output_is_view for p in prof] == [False, False, True, False, False, False]
    for plan in all_plans(len(layers)):   # [0, 2, 3] too: a segment of the view alone, which
        #                                   saves nothing, so its checkpoint keeps nothing
        assert widgets.measure_plan_peak(layers, x, plan) == planner.step_peak_bytes(plan, prof)
    for plan in planner.pareto_front(prof):
        assert widgets.measure_plan_peak(layers, x, plan.boundaries) == plan.peak_bytes


def test_what_the_allocator_holds_beyond_a_budget(one_thread):
    """plan_chain's docstring: a budget counts tensor bytes as track_memory sees them; every
    live checkpoint keeps the CPU generator's state on top, 5,056 bytes, which the allocator's
    own events see and track_memory does not."""
    from ckpt_lab import checkpoint_sequential, track_memory
    from ckpt_lab.measure.allocator import profiled_memory
    layers, x = mlp()
    prof = profile_layers(layers, x, repeats=1)
    plan = planner.pareto_front(prof)[0]               # the tightest: the most checkpoints
    live = plan.segments - 1
    state = torch.get_rng_state().untyped_storage().nbytes()
    assert live >= 2 and state == 5056                 # the figure the docstring gives
    for preserve, each in ((True, state), (False, 0)):
        seen = {}

        def forward():
            with track_memory() as mem:
                seen["y"] = checkpoint_sequential(layers, x, boundaries=plan.boundaries,
                                                  preserve_rng_state=preserve)
            seen["tensors"] = mem.current_bytes

        after_forward = profiled_memory(forward)
        del seen["y"]
        assert after_forward.end_bytes - seen["tensors"] == live * each


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_model_on_cuda():
    layers, x = gpt()
    layers, x = [layer.cuda() for layer in layers], x.cuda()
    prof = profile_layers(layers, x, repeats=1)
    for plan in ([0], [0, 2], [0, 1, 3, 5]):
        measured = widgets.measure_plan_peak(layers, x, plan)
        assert abs(measured / planner.step_peak_bytes(plan, prof) - 1) <= 0.03, plan
    least = planner.minimum_peak(prof)
    plan = planner.optimal_segments(prof, least)
    assert widgets.measure_plan_peak(layers, x, plan.boundaries) <= least
