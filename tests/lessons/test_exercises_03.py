"""Lesson 3's predictions: judged against measurements of PyTorch's checkpoint_sequential."""
import pytest

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson03

from exercise_checks import in_your_code, right_then_wrong


def _best_units(layers: int) -> int:
    """Least uniform checkpoint_sequential peak, in units, by brute force."""
    return min((s - 1) + (layers - (s - 1) * (layers // s)) for s in range(1, layers + 1))


def test_the_measured_answers_and_the_shape_of_the_curve():
    assert lesson03.best_segments() == 4
    assert lesson03.peak_moment() == "a recompute tooth"       # a first segment longer than the last
    uniform = lesson03.chain_logs(16, (4,))[4]
    assert lesson03.moment_of(uniform) == "start of backward"   # uniform segments: no tooth wins
    assert lesson03.sqrt_growth() == pytest.approx(_best_units(64) / _best_units(16))
    assert lesson03.chain_peak_units(16, 6) > lesson03.chain_peak_units(16, 5)   # a step up
    assert lesson03.chain_peak_units(16, 9) == 16            # S > L / 2: no saving at all here
    assert formulas.optimal_segment_count(16, 1, 1) == lesson03.best_segments()


@pytest.mark.parametrize("key, right, wrong, hint", [
    ("03.best_segments", 4, 1, "last one is long"),
    ("03.best_segments", 4, 12, "L/2"),
    ("03.best_segments", 4, 6, "kept inputs"),
    ("03.peak_moment", "a recompute tooth", "start of backward", "rebuilds 12 blocks"),
    ("03.peak_moment", "a recompute tooth", "end of forward", "after the forward"),
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


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("03_how_many_segments")


def _lesson(name):
    import nbformat
    from pathlib import Path
    return nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / f"{name}.ipynb",
                         as_version=4)


def test_in_your_code_searches_the_segments_for_any_a_and_b():
    """The closing's rule is right beyond a = b (a transformer block keeps far more than it
    passes on, lesson 9): its peak function, run for many chains, picks the segment count of
    formulas.optimal_segment_count, which lesson 3 holds to measurement for a = b and a = 5 b."""
    import re
    from ckpt_lab import formulas
    code = in_your_code("03_how_many_segments")
    assert "isqrt(len(blocks))" not in code.replace("isqrt(L) segments", "")
    scope = {}
    exec(re.search(r"^def peak.*?\n(?:    .*\n)+", code, re.M).group(0), scope)
    for L in (4, 12, 16, 48, 64):
        for a, b in ((1, 1), (5, 1), (18, 1)):
            best = min(range(1, L + 1), key=lambda S: (scope["peak"](S, L, a, b), S))
            assert best == formulas.optimal_segment_count(L, a, b), (L, a, b)


def test_the_best_count_is_not_given_away_before_it_is_asked():
    """03.best_segments: neither lesson 3's title and header nor the tour says sqrt(L)."""
    import re
    from ckpt_lab.lessons import course
    assert "sqrt" not in course.LESSONS["03_how_many_segments"].lower()
    header = _lesson("03_how_many_segments").cells[0].source
    tour = "\n".join(c.source for c in _lesson("00_tour").cells if c.cell_type == "markdown")
    for text in (header, tour):
        words = re.sub(r"\([^()\s]*\)", "", text)             # link targets name the file
        assert "√" not in words and "sqrt" not in words.lower()
