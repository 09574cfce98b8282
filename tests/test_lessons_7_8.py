"""Exercise checks and figure helpers of lesson 7 (combining techniques): right answers pass,
wrong ones fail with a hint. Lesson 8's are in test_exercises_08.py."""
import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises, plots
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


def test_unanswered_and_non_numbers():
    for key in exercises.keys(7):
        assert exercises.check(key, None) is False
        assert exercises.check(key, "a string") is False
    assert len(exercises.keys(7)) == 3


def test_budget_scatter_fills_fitting_points_and_draws_the_budget():
    fig = plots.budget_scatter(["a", "b"], [2 * 2 ** 20, 5 * 2 ** 20], [0.0, 1.0], 3 * 2 ** 20)
    ax = fig.axes[0]
    faces = [c.get_facecolors() for c in ax.collections]
    assert faces[0].shape[0] == 1 and faces[0][0][3] > 0          # a fits: filled
    assert faces[1].shape[0] == 0 or faces[1][0][3] == 0          # b does not: hollow
    assert any(abs(line.get_ydata()[0] - 3.0) < 1e-9 for line in ax.lines)
    with pytest.raises(ValueError):
        plots.budget_scatter(["a"], [1, 2], [0.0], 3)
