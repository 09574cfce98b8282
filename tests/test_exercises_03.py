"""Lesson 3's predictions: judged against measurements of PyTorch's checkpoint_sequential."""
import pytest

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson03

from exercise_checks import right_then_wrong


def _best_units(layers: int) -> int:
    """Least uniform checkpoint_sequential peak, in units, by brute force."""
    return min((s - 1) + (layers - (s - 1) * (layers // s)) for s in range(1, layers + 1))


def test_the_measured_answers_and_the_shape_of_the_curve():
    assert lesson03.best_segments() == 4
    assert lesson03.peak_moment() == "start of backward"
    assert lesson03.sqrt_growth() == pytest.approx(_best_units(64) / _best_units(16))
    assert lesson03.chain_peak_units(16, 6) > lesson03.chain_peak_units(16, 5)   # a step up
    assert lesson03.chain_peak_units(16, 9) == 16            # S > L / 2: no saving at all here
    assert formulas.optimal_segment_count(16, 1, 1) == lesson03.best_segments()


@pytest.mark.parametrize("key, right, wrong, hint", [
    ("03.best_segments", 4, 1, "last one is long"),
    ("03.best_segments", 4, 12, "L/2"),
    ("03.best_segments", 4, 6, "kept inputs"),
    ("03.peak_moment", "start of backward", "a recompute tooth", "fewer kept inputs"),
    ("03.peak_moment", "start of backward", "end of forward", "after the forward"),
    ("03.sqrt_growth", _best_units(64) / _best_units(16), 2.0, "continuous estimate"),
    ("03.sqrt_growth", 15 / 7, 4.0, "sqrt(L)"),
])
def test_right_and_wrong(key, right, wrong, hint, capsys):
    right_then_wrong(key, right, wrong, hint, capsys)


def test_malformed_answers_never_raise(capsys):
    assert exercises.check("03.best_segments", "four") is False
    assert exercises.check("03.peak_moment", "backward") is False
    assert "one of" in capsys.readouterr().out
    assert exercises.keys(3) == ["03.best_segments", "03.peak_moment", "03.sqrt_growth"]
