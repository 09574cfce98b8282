"""The tour's predictions: each is judged against a measurement, and each wrong answer gets a hint."""
import pytest

from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson00


def test_the_measured_answers():
    assert 0.6 < lesson00.peak_ratio() < 0.8            # 10.5 -> 7.5 MiB at the tour's CPU sizes
    assert lesson00.losses_verdict() == "identical"


@pytest.mark.parametrize("key, right, wrongs", [
    ("00.peak_ratio", 0.7, [1.0, 0.25]),
    ("00.same_losses", "identical", ["close", "different"]),
])
def test_right_and_wrong(key, right, wrongs, capsys):
    assert exercises.check(key, right) is True
    assert "✓" in capsys.readouterr().out
    for wrong in wrongs:
        assert exercises.check(key, wrong) is False
        out = capsys.readouterr().out
        assert "✗" in out and len(out) > 60          # a hint, not just a cross


def test_malformed_answers_and_predictions_never_raise(capsys):
    assert exercises.check("00.peak_ratio", "most of it") is False
    assert exercises.check("00.same_losses", 1) is False
    assert "one of" in capsys.readouterr().out
    guess = exercises.predict("00.same_losses", "identical")
    assert guess.reveal() is True
    assert exercises.keys(0) == ["00.peak_ratio", "00.same_losses"]


def test_the_tour_measures_the_segments_its_question_names():
    """The tour cuts its layers into lesson00.SEGMENTS segments, the count 00.peak_ratio asks
    about, typed as a number (not as sqrt(L), which would give lesson 3's answer away)."""
    import re
    from pathlib import Path
    import nbformat
    tour = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / "00_tour.ipynb", as_version=4)
    code = "\n".join(c.source for c in tour.cells if c.cell_type == "code")
    assert re.search(rf"^segments = {lesson00.SEGMENTS}\b", code, re.M)
    assert f"in {lesson00.SEGMENTS} segments" in exercises.question("00.peak_ratio")


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("00_tour")
