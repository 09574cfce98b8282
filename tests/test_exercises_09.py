"""Lesson 9: its predictions accept the answer worked out another way (by torch's own
checkpoint_sequential, by brute force) and reject the diagnostic wrong ones; its build task (article
B's formula, corrected) is judged against measurements; the audit's verdict rules and table, its
disk meter, and the lesson's naming of both source articles."""
import os

import nbformat
import pytest
import torch

from ckpt_lab.lessons import audit, exercises

from exercise_checks import judge, unanswered_and_malformed

LESSON = os.path.join(os.path.dirname(__file__), "..", "notebooks", "09_checking_the_claims.ipynb")


def test_true_saving_is_what_torchs_checkpoint_sequential_measures():
    chain, x = audit.mlp_chain(100, 16), torch.randn(32, 16)
    plain = audit.step_peak(lambda: chain(x), chain)
    ckpt = audit.step_peak(lambda: torch.utils.checkpoint.checkpoint_sequential(
        chain, 10, x, use_reentrant=False), chain)
    measured = 1 - ckpt / plain
    assert abs(measured - exercises.lesson09.true_saving_100_10()) < 0.005
    for right in (measured, round(measured, 2), 0.81):         # as printed; the kept-units view
        assert judge("09.true_saving_100_10", right)
    for wrong in (0.9, 0.5, 0.1):                               # the article's 90%; guesses
        assert not judge("09.true_saving_100_10", wrong)


def test_best_segments_by_brute_force():
    peak = {s: (s - 1) + 18 * (48 - (s - 1) * (48 // s)) for s in range(1, 49)}
    best = min(peak, key=lambda s: (peak[s], s))
    assert best == exercises.lesson09.best_segments_transformer() == 24
    assert judge("09.best_segments_transformer", 24)
    for wrong, hint in ((7, "sqrt(L)"), (29, "continuous"), (8, "every S"), (48, "every S")):
        ok, message = exercises.EXERCISES["09.best_segments_transformer"].judge(wrong)
        assert not ok and hint in message
    assert not judge("09.best_segments_transformer", 0)


def test_accumulation_bound_by_hand():
    state = 7e9 * 16
    right = (state + 60 * 2 ** 30) / state
    assert abs(exercises.lesson09.accumulation_bound() / right - 1) < 1e-12
    assert judge("09.accumulation_bound", right) and judge("09.accumulation_bound", round(right, 2))
    for wrong in (2.0, 4.0, 60 * 2 ** 30 / state):              # the article's range; act / state
        assert not judge("09.accumulation_bound", wrong)


PREDICTIONS = [k for k in exercises.keys(9) if k != "09.step_peak_formula"]


@pytest.mark.parametrize("key", PREDICTIONS)
def test_unanswered_and_malformed(key, capsys):
    unanswered_and_malformed([key], "many", capsys)
    assert exercises.EXERCISES[key].expected is not None


def _right(L, S, B, T, H, byte_per=2):           # the worked solution's count
    return ((S - 1) + (L - (S - 1) * (L // S)) + 1) * B * T * H * byte_per


def test_build_task_accepts_the_count_that_torchs_checkpoint_sequential_measures(capsys):
    from ckpt_lab.lessons.exercises import lesson09
    B, T, H = lesson09.FORMULA_SIZES
    for L, S in lesson09.FORMULA_CASES:             # the judge's measurement, by its own count
        measured = lesson09.measured_step_peak(L, S, B, T, H)
        assert abs(measured / _right(L, S, B, T, H, 4) - 1) < 0.01
    assert exercises.check("09.step_peak_formula", _right) is True
    assert "MiB" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda L, S, B, T, H, byte_per=2: _right(L, S, B, T, H, byte_per) - B * T * H * byte_per,
     "first gradient"),                                                  # no gradient in flight
    (lambda L, S, B, T, H, byte_per=2: ((S - 1) + L / S + 1) * B * T * H * byte_per,
     "L // S"),                                                          # L/S, no remainder
    (lambda L, S, B, T, H, byte_per=2: (S + 1 + 2) * B * T * H * byte_per,
     "alive at the start of backward"),                                  # article B's formula
    (lambda L, S, B, T, H, byte_per=2: (S + L // S + 1) * B * T * H * byte_per, "units"),
])
def test_build_task_rejects_plausible_wrong_formulas(wrong, hint):
    ok, message = exercises.EXERCISES["09.step_peak_formula"].judge(wrong)
    assert not ok and hint in message, message


def test_build_task_unsolved_or_broken_never_raises(capsys):
    def unsolved(L, S, B, T, H, byte_per=2):
        ...

    def broken(L, S, B, T, H, byte_per=2):
        raise RuntimeError("boom")

    for answer in (None, unsolved, broken, 3, lambda L, S, B, T, H, byte_per=2: "many"):
        assert exercises.check("09.step_peak_formula", answer) is False
    out = capsys.readouterr().out
    assert out.count("not answered yet") == 2 and "boom" in out


def test_the_lesson_ships_the_build_task_unsolved(capsys):
    cell = next(c.source for c in nbformat.read(LESSON, as_version=4).cells
                if 'exercises.check("09.step_peak_formula"' in c.source)
    exec(cell, {"exercises": exercises})
    assert "not answered yet" in capsys.readouterr().out


def test_verdict_rules_and_the_audit_table():
    assert audit.judge_number(1.04, 1.0) == "holds"
    assert audit.judge_number(1.5, 1.0) == "partly holds" == audit.judge_number(0.6, 1.0)
    assert audit.judge_number(2.5, 1.0) == "does not hold" == audit.judge_number(0.4, 1.0)
    assert audit.judge_range(0.3, 0.2, 0.4) == "holds" and audit.judge_range(0.7, 0.2, 0.4) == "partly holds"
    assert audit.judge_range(0.9, 0.2, 0.4) == "does not hold"
    assert audit.worst(["holds", "does not hold", "partly holds"]) == "does not hold"
    table = audit.Audit(where="CPU here")
    assert table.add("B.sqrt", "exponent 0.49", "holds") == "holds"
    table.add("B.disk", "0 B", "does not hold", where="elsewhere")
    assert table.counts() == {"holds": 1, "partly holds": 0, "does not hold": 1}
    assert table.rows[0].measured.endswith("— CPU here") and table.rows[1].measured.endswith("— elsewhere")
    assert "2 claims: 1 hold" in table.summary() and "<table>" in table.html()
    # every verdict first, the tally last, in text and in HTML
    lines = table.text().splitlines()
    assert [l.split()[0] for l in lines[:2]] == ["holds", "does"] and lines[-1] == table.summary()
    assert table.html().index("<table>") < table.html().index(table.summary())
    # a claim filed again (its cell run twice) replaces its row in place
    table.add("B.sqrt", "exponent 0.70", "partly holds")
    assert len(table.rows) == 2 and table.rows[0].verdict == "partly holds"
    with pytest.raises(ValueError):
        table.add("B.nothing", "x", "holds")
    with pytest.raises(ValueError):
        table.add("B.sqrt", "x", "maybe")


def test_disk_meter_sees_a_write_and_a_checkpointed_step_writes_nothing(tmp_path):
    path = tmp_path / "x.pt"
    control = audit.disk_writes(lambda: torch.save(torch.zeros(4096), open(path, "wb")))
    assert str(path) in control.opened_for_write
    assert control.written_bytes < 0 or control.written_bytes >= 4096 * 4
    chain, x = audit.mlp_chain(8, 16), torch.randn(32, 16)
    step = audit.disk_writes(lambda: torch.utils.checkpoint.checkpoint_sequential(
        chain, 4, x, use_reentrant=False).sum().backward())
    assert step.opened_for_write == () and step.new_entries == ()


def test_the_lesson_names_both_articles_where_a_reader_can_find_them():
    text = " ".join(" ".join(c.source.split()) for c in nbformat.read(LESSON, as_version=4).cells
                    if c.cell_type == "markdown")
    for source in audit.SOURCES.values():
        assert source.title in text and source.gloss in text and source.published in text
        assert (source.url in text) if source.url else "no address" in text
    assert set(k.split(".")[0] for k in audit.CLAIMS) == set(audit.SOURCES)
