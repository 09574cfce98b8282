"""What the tests of each lesson's exercises share: judging an answer quietly, a right answer
met with ✓ and a wrong one with ✗ and its hint, and an unanswered or malformed answer met with
a message instead of an exception."""
from ckpt_lab.lessons import exercises


def judge(key: str, answer) -> bool:
    """Whether exercise `key` judges `answer` right (nothing printed)."""
    return exercises.EXERCISES[key].judge(answer)[0]


def right_then_wrong(key: str, right, wrong, hint: str, capsys) -> None:
    """`right` prints ✓; `wrong` prints ✗ and a hint containing `hint`."""
    assert exercises.check(key, right) is True
    assert "✓" in capsys.readouterr().out
    assert exercises.check(key, wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and hint in out


def unanswered_and_malformed(keys, malformed, capsys) -> None:
    """Neither None nor `malformed` raises or counts as right; None says "not answered yet"."""
    for key in keys:
        assert exercises.check(key, None) is False
        assert exercises.check(key, malformed) is False
    assert "not answered yet" in capsys.readouterr().out
