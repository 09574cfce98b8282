"""Every exercise never raises on an unanswered or malformed answer, and every lesson has 2-3
predictions. Each lesson's right and wrong answers are tested in tests/test_exercises_NN.py."""
import pytest

from ckpt_lab.lessons import exercises


def test_unanswered_and_malformed_never_raise(capsys):
    for key in exercises.keys():
        assert exercises.check(key, None) is False
        assert "not answered yet" in capsys.readouterr().out


def test_unknown_key_and_lesson_filter():
    with pytest.raises(ValueError, match="valid"):
        exercises.check("99.nope", 1)
    for lesson in range(1, 11):
        assert 2 <= len(exercises.keys(lesson)) <= 4     # 2-3 predictions, at most one build task
    assert all(exercises.question(k).endswith("?") or "." in exercises.question(k)
               for k in exercises.keys())
