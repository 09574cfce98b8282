"""Lesson 1's predictions: judged against measurements, with a diagnosis for each wrong answer."""
import pytest

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson01

from exercise_checks import right_then_wrong


def test_the_measured_answers():
    assert lesson01.parts_that_grow() == {"activations"}
    assert lesson01.mixed_adam_bytes_per_param() == pytest.approx(
        formulas.model_state_per_param("mixed", "adam").total, rel=1e-3)
    parts = lesson01.mixed_adam_parts(dict(block_size=16, width=64, depth=2))
    assert parts["master copy"] == 2 * parts["parameters"] == 2 * parts["gradients"]


@pytest.mark.parametrize("key, right, wrong, hint", [
    ("01.grows_with_batch", {"activations"}, {"activations", "gradients"}, "shape of its parameter"),
    ("01.grows_with_batch", "activations", {"optimizer states", "activations"}, "per parameter"),
    ("01.grows_with_batch", ["activations"], {"parameters"}, "every token"),
    ("01.mixed_adam_bytes", 16, 8, "master copy"),
    ("01.mixed_adam_bytes", 16.0, 18, "fp32 (18 bytes)"),
])
def test_right_and_wrong(key, right, wrong, hint, capsys):
    right_then_wrong(key, right, wrong, hint, capsys)


def test_malformed_answers_never_raise(capsys):
    assert exercises.check("01.grows_with_batch", {"weights"}) is False
    assert exercises.check("01.mixed_adam_bytes", "sixteen") is False
    assert "Unknown names" in capsys.readouterr().out
    assert exercises.keys(1) == ["01.grows_with_batch", "01.mixed_adam_bytes"]


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("01_where_memory_goes")
