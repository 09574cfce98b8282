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


def test_near_judges_each_side_and_keeps_its_tolerance_exact():
    from ckpt_lab.lessons.exercises.base import near
    judge = near(lambda: 2.0, 0.5, right="{expected:.1f} ({value:g})", low="low {expected:g}",
                 high="high", facts=lambda: {"unused": 1})
    assert judge(2.5) == (True, "2.0 (2.5)") and judge(1.5)[0]          # inclusive by default
    assert judge(1.4) == (False, "low 2") and judge(2.6) == (False, "high")
    strict = near(lambda: 2.0, 0.5, right="ok", low="low", strict=True)
    assert not strict(2.5)[0] and strict(2.49)[0] and strict(9) == (False, "low")
    exact = near(lambda: 3, 0, right="ok", low="few", high="many")
    assert exact(3)[0] and exact(2.999) == (False, "few") and exact(3.001) == (False, "many")
    relative = near(lambda: 100.0, 0.02, low="low", high="high", relative=True)
    assert relative(102) == (True, "102 is right.") and relative(97.9) == (False, "low")
    assert relative(102.1)[1] == "high"
    with pytest.raises(TypeError, match="expected a number"):
        judge("two")


def test_one_of_asks_again_outside_its_choices_and_gives_each_wrong_answer_its_hint():
    from ckpt_lab.lessons.exercises.base import one_of
    judge = one_of(("a", "b", "c"), lambda: "b", right="{expected} {r}", wrong="not {expected}",
                   hints={"c": "c? {r}"}, normalise=str.lower, facts=lambda: {"r": 7})
    assert judge("B") == (True, "b 7") and judge("a") == (False, "not b")
    assert judge("C") == (False, "c? 7")
    assert judge("d") == judge(1) == (False, "Answer one of ('a', 'b', 'c').")
    truth = one_of((True, False), lambda: True, "yes", "no")
    assert truth(True)[0] and truth(False) == (False, "no")
    assert not truth(1)[0] and "one of" in truth(1)[1]                  # 1 == True, but no bool


def test_name_set_reads_one_name_or_many_and_names_what_is_unknown():
    from ckpt_lab.lessons.exercises.base import name_set, not_quite
    judge = name_set(("x", "y", "z"), lambda: {"x", "y"}, right=lambda want: f"{sorted(want)}",
                     wrong=lambda given, want: not_quite([f"missing {sorted(want - given)}"]),
                     what="letters")
    assert judge(["y", "x"]) == (True, "['x', 'y']")
    assert judge("x") == (False, "Not quite: missing ['y'].")
    assert judge({"w"}) == (False, "Unknown letters ['w']; choose from ['x', 'y', 'z'].")
    assert judge(3) == (False, "Give a set of letters, e.g. {'x', 'y'}.")
    numbers = name_set((1, 2, 3), lambda: {2}, "ok", lambda g, w: "no", convert=int,
                       normalise=abs)
    assert numbers(2)[0] and numbers(["-2"])[0] and numbers({1}) == (False, "no")
    assert numbers("x")[1].startswith("Give a set") and numbers({4})[1].startswith("Unknown")
