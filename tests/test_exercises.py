"""Every exercise accepts a right answer worked out independently, rejects a wrong one with a
hint, and never raises on an unanswered or malformed one."""
import math

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab.lessons import exercises
from ckpt_lab.memory import kept_after_forward


def _best_peak(layers: int) -> int:
    """Least uniform checkpoint_sequential peak, in layer units, by brute force."""
    best = None
    for s in range(1, layers + 1):
        size = layers // s
        peak = (s - 1) + (layers - (s - 1) * size)
        best = peak if best is None else min(best, peak)
    return best


def _torch_checkpoint(fn, x):
    return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)


def _branch_saving_by_hand():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
    branch = lambda t: torch.relu(bn(conv(t)))
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    plain = kept_after_forward(lambda t: t + branch(t), x)
    ckpt = kept_after_forward(lambda t: t + _torch_checkpoint(branch, t), x)
    return plain - ckpt


def _save_matmuls(op, *args, **kwargs):
    return op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


RIGHT = {
    # blocks: 3 x Linear(64, 64) with bias; head Linear(64, 256) with bias; embedding frozen
    "01.frozen_adamw_bytes": (8 * (3 * (64 * 64 + 64) + 64 * 256 + 256),
                              8 * (3 * (64 * 64 + 64) + 64 * 256 + 256 + 256 * 64)),
    "01.block_activation_bytes": (8 * 64 * 512 * 4, 2 * 8 * 64 * 512 * 4),
    "01.adam_fp32_7b": (7e9 * 16 / 2 ** 30, 7e9 * 16 / 1e9 * 2),
    "02.my_checkpoint": (_torch_checkpoint, lambda fn, x: fn(x)),
    "02.rng_layers": ({"Dropout", "AlphaDropout", "RReLU"}, {"Dropout"}),   # section 5 shows only Dropout
    "03.peak_at_six": ((6 - 1) + (16 - 5 * (16 // 6)), 16 // 6),
    "03.peak_in_layers": (5 + 6, 6),
    "03.sqrt_growth": (_best_peak(64) / _best_peak(16), 2.0),   # 2 sqrt(L) is only the estimate
    "04.no_saving_modules": ({"Linear", "ReLU", "GELU", "Linear->ReLU"}, {"Linear", "Dropout"}),
    "04.selective_policy": (_save_matmuls, lambda op, *a, **k: False),
    "05.megatron_gib": (2048 * 12288 * (34 + 5 * 96 * 2048 / 12288) / 2 ** 30, 1.0),
    "05.crossover_seq": (34 * 768 / (5 * 12), 2048),
    "05.selective_fraction": ((5 * 12 * 2048 / 768) / (34 + 5 * 12 * 2048 / 768), 0.5),
}


def test_every_exercise_of_lessons_1_to_5_has_a_right_and_a_wrong_answer_here():
    part_one = {k for lesson in range(1, 6) for k in exercises.keys(lesson)}
    assert set(RIGHT) | {"02.branch_saving"} == part_one


@pytest.mark.parametrize("key", sorted(RIGHT))
def test_right_and_wrong(key, capsys):
    right, wrong = RIGHT[key]
    assert exercises.check(key, right) is True
    assert "✓" in capsys.readouterr().out
    assert exercises.check(key, wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and len(out) > 40          # a hint, not just a cross


def test_branch_saving_against_torch_checkpoint(capsys):
    saving = _branch_saving_by_hand()
    assert saving > 2 * 4 * 8 * 16 * 16 * 4 * 0.99
    assert exercises.check("02.branch_saving", saving)
    assert not exercises.check("02.branch_saving", 0)


def test_unanswered_and_malformed_never_raise(capsys):
    for key in exercises.keys():
        assert exercises.check(key, None) is False
        assert "not answered yet" in capsys.readouterr().out
    assert exercises.check("03.peak_at_six", "eleven") is False
    assert exercises.check("02.rng_layers", {"Conv"}) is False
    assert exercises.check("02.rng_layers", {"Dropout", "AlphaDropout", "RReLU", "BatchNorm1d"}) is False
    assert exercises.check("02.my_checkpoint", 3) is False
    assert "Conv" in capsys.readouterr().out


def test_a_raising_answer_is_reported(capsys):
    def broken(fn, x):
        raise RuntimeError("boom")
    assert exercises.check("02.my_checkpoint", broken) is False
    assert "boom" in capsys.readouterr().out


def test_unknown_key_and_lesson_filter():
    with pytest.raises(ValueError, match="valid"):
        exercises.check("99.nope", 1)
    assert exercises.keys(3) == ["03.peak_at_six", "03.peak_in_layers", "03.sqrt_growth"]
    for lesson in range(1, 11):
        assert 2 <= len(exercises.keys(lesson)) <= 3
    assert all(exercises.question(k).endswith("?") or "." in exercises.question(k)
               for k in exercises.keys())


def test_rng_layers_measured():
    assert exercises.lesson02.layers_needing_rng() == {"Dropout", "AlphaDropout", "RReLU"}
    assert math.isclose(_best_peak(16), 7)


def test_lesson_3_and_4_checks_are_measured(capsys):
    """The S = 6 bump is measured, a one-layer-per-segment split saves nothing, and a policy that
    keeps the matmuls drops the GELU output without re-running a matmul."""
    assert exercises.lesson03.chain_peak_units(16, 6) > exercises.lesson03.chain_peak_units(16, 5)
    assert exercises.lesson03.chain_peak_units(16, 9) == 16            # S > L / 2: no saving at all
    saving = exercises.lesson04.checkpoint_saving_bytes()
    assert saving["Linear"] == 0 and saving["Linear->ReLU->Linear"] > 0
    cost = exercises.lesson04.policy_cost(_save_matmuls)
    assert cost["policy_flops"] == cost["plain_flops"] < cost["full_flops"]
    assert cost["full_bytes"] < cost["policy_bytes"] < cost["plain_bytes"]
    assert exercises.check("04.selective_policy", 3) is False
    assert exercises.check("04.no_saving_modules", {"Conv"}) is False
    assert "Conv" in capsys.readouterr().out
