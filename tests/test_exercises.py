"""Every exercise accepts a right answer worked out independently, rejects a wrong one with a
hint, and never raises on an unanswered or malformed one."""
import pytest
import torch

from ckpt_lab.lessons import exercises


def _save_matmuls(op, *args, **kwargs):
    return op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


RIGHT = {
    "04.no_saving_modules": ({"Linear", "ReLU", "GELU", "Linear->ReLU"}, {"Linear", "Dropout"}),
    "04.selective_policy": (_save_matmuls, lambda op, *a, **k: False),
    "05.megatron_gib": (2048 * 12288 * (34 + 5 * 96 * 2048 / 12288) / 2 ** 30, 1.0),
    "05.crossover_seq": (34 * 768 / (5 * 12), 2048),
    "05.selective_fraction": ((5 * 12 * 2048 / 768) / (34 + 5 * 12 * 2048 / 768), 0.5),
}


def test_every_exercise_of_lessons_4_and_5_has_a_right_and_a_wrong_answer_here():
    """Lessons 0 to 3 have their own files (tests/test_exercises_00.py to _03.py)."""
    part_one = {k for lesson in range(4, 6) for k in exercises.keys(lesson)}
    assert set(RIGHT) == part_one


@pytest.mark.parametrize("key", sorted(RIGHT))
def test_right_and_wrong(key, capsys):
    right, wrong = RIGHT[key]
    assert exercises.check(key, right) is True
    assert "✓" in capsys.readouterr().out
    assert exercises.check(key, wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and len(out) > 40          # a hint, not just a cross


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


def test_lesson_4_checks_are_measured(capsys):
    """A policy that keeps the matmuls drops the GELU output without re-running a matmul."""
    saving = exercises.lesson04.checkpoint_saving_bytes()
    assert saving["Linear"] == 0 and saving["Linear->ReLU->Linear"] > 0
    cost = exercises.lesson04.policy_cost(_save_matmuls)
    assert cost["policy_flops"] == cost["plain_flops"] < cost["full_flops"]
    assert cost["full_bytes"] < cost["policy_bytes"] < cost["plain_bytes"]
    assert exercises.check("04.selective_policy", 3) is False
    assert exercises.check("04.no_saving_modules", {"Conv"}) is False
    assert "Conv" in capsys.readouterr().out
