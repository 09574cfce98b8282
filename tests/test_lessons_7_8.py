"""Exercise checks and figure helpers added for lessons 7 (combining techniques) and 8
(capacity and out-of-memory fallback): right answers pass, wrong ones fail with a hint."""
import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ckpt_lab import capacity, formulas
from ckpt_lab.lessons import exercises, plots
from ckpt_lab.fallback import StepConfig, run_with_fallback
from ckpt_lab.models import GPTConfig, build_model
from ckpt_lab.offload import PCIE4_X16_BYTES_PER_S


def _judge(key, answer):
    return exercises.EXERCISES[key].judge(answer)[0]


def test_accumulation_flops_ratio_is_measured_as_one():
    assert exercises.lesson07.accumulation_flops_ratio(4) == 1.0
    assert _judge("07.accumulation_flops", 1.0)
    assert not _judge("07.accumulation_flops", 4.0)
    assert not _judge("07.accumulation_flops", 0.25)


def test_accumulation_peak_matches_a_measured_micro_batch():
    """The expected answer (the formula at batch 2) is what a batch-2 step of that GPT peaks at."""
    cfg = GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.1)
    model = build_model(cfg)
    layers = formulas.gpt_layers(2, 64, 4, 128, 4, 256, 4, True)
    expected = formulas.chain_peak_bytes(layers, model.segments(), 2 * 64, 256, 4)
    x = torch.randint(0, 256, (2, 64))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    from ckpt_lab import track_memory
    with track_memory() as mem:
        model(x, x).backward()
    assert 0.98 <= mem.peak_bytes / expected <= 1.03
    assert _judge("07.accumulation_peak", expected)
    full = formulas.chain_peak_bytes(formulas.gpt_layers(8, 64, 4, 128, 4, 256, 4, True),
                                     model.segments(), 8 * 64, 256, 4)
    assert not _judge("07.accumulation_peak", full)


def test_offload_seconds_counts_both_directions():
    one_way = 6 * 2 ** 30 / PCIE4_X16_BYTES_PER_S
    assert _judge("07.offload_seconds", 2 * one_way)
    assert not _judge("07.offload_seconds", one_way)
    assert not _judge("07.offload_seconds", 2 * 6e9 / PCIE4_X16_BYTES_PER_S * 1.1)


def test_fused_block_prediction_is_the_formula_and_the_measurement():
    """08.1: the layer formula for fused attention predicts the measured block within 1%; the
    usual wrong counts (scores kept, input forgotten, output counted twice) fail."""
    measured = exercises.lesson08.fused_block_saved_bytes()
    b, t, c, h = 8, 64, 128, 4
    fused = sum(formulas.transformer_layer_terms(t, b, c, h, attention="sdpa", dropout=False,
                                                 act_bytes=4).values())
    eager = sum(formulas.transformer_layer_terms(t, b, c, h, dropout=False,
                                                 act_bytes=4).values())
    assert 1.0 <= measured / fused <= 1.01
    assert _judge("08.fused_block_bytes", fused)
    sbh = b * t * c * 4
    for wrong in (eager, fused - sbh, fused + sbh, 34 * sbh // 4):
        assert not _judge("08.fused_block_bytes", wrong)


def test_usable_gib():
    assert _judge("08.usable_gib", 0.85 * 80e9 / 2 ** 30)
    assert not _judge("08.usable_gib", 0.85 * 80)                    # GB taken for GiB


def test_fallback_rungs_by_order_and_the_check():
    assert exercises.lesson08.fallback_rungs(("densify", "accumulate", "shrink")) == 6
    assert exercises.lesson08.fallback_rungs(("accumulate", "densify", "shrink")) == 3
    assert _judge("08.fallback_rungs", 6)
    assert not _judge("08.fallback_rungs", 3)


def test_fallback_rungs_agrees_with_a_real_step_under_a_simulated_limit():
    """The toy step of the exercise behaves like a real MLP step whose peak scales with the
    micro-batch and not with checkpointing: same number of rungs."""
    from ckpt_lab import track_memory
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    x = torch.randn(8, 64)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)      # model state exists before the step, as in the lessons

    def peak(micro):
        with track_memory() as mem:
            net(x[:micro]).sum().backward()
        return mem.peak_bytes

    limit = (peak(2) + peak(4)) // 2

    def step(config):
        with track_memory(limit_bytes=limit):
            for xm in x[:config.batch_size].chunk(config.accumulation_steps):
                net(xm).sum().backward()
        return config

    res = run_with_fallback(step, StepConfig(0, 1, 8), max_every=4)
    assert res.config.micro_batch == 2
    assert len(res.rungs) == exercises.lesson08.fallback_rungs(("densify", "accumulate", "shrink"))


def test_unanswered_and_non_numbers():
    for key in exercises.keys(7) + exercises.keys(8):
        assert exercises.check(key, None) is False
        assert exercises.check(key, "a string") is False
    assert len(exercises.keys(7)) == 3 and len(exercises.keys(8)) == 3


def test_budget_scatter_fills_fitting_points_and_draws_the_budget():
    fig = plots.budget_scatter(["a", "b"], [2 * 2 ** 20, 5 * 2 ** 20], [0.0, 1.0], 3 * 2 ** 20)
    ax = fig.axes[0]
    faces = [c.get_facecolors() for c in ax.collections]
    assert faces[0].shape[0] == 1 and faces[0][0][3] > 0          # a fits: filled
    assert faces[1].shape[0] == 0 or faces[1][0][3] == 0          # b does not: hollow
    assert any(abs(line.get_ydata()[0] - 3.0) < 1e-9 for line in ax.lines)
    with pytest.raises(ValueError):
        plots.budget_scatter(["a"], [1, 2], [0.0], 3)
