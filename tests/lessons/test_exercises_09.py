"""Lesson 9: its predictions accept the answer worked out another way (by torch's own
checkpoint_sequential, by brute force) and reject the diagnostic wrong ones; its build task (the
step peak of GPT blocks in S segments, from A, X and the plain peak) is judged against
measurements; the audit's verdict rules and table, its disk meter, and the lesson's naming of
both source articles."""
import os

import nbformat
import pytest
import torch

from torch import nn

from ckpt_lab import track_memory
from ckpt_lab.lessons import audit, exercises
from ckpt_lab.training.models import MLPBlock

from exercise_checks import judge, unanswered_and_malformed

LESSON = os.path.join(os.path.dirname(__file__), "..", "..", "notebooks", "09_checking_the_claims.ipynb")


def _mlp_chain(depth, width):
    torch.manual_seed(0)
    return nn.Sequential(*[MLPBlock(width) for _ in range(depth)])


def _step_peak(run, module):          # gradients allocated first: the step peak (activations)
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        run().sum().backward()
    return mem.peak_bytes


def test_true_saving_is_what_torchs_checkpoint_sequential_measures():
    chain, x = _mlp_chain(100, 16), torch.randn(32, 16)
    plain = _step_peak(lambda: chain(x), chain)
    ckpt = _step_peak(lambda: torch.utils.checkpoint.checkpoint_sequential(
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


PREDICTIONS = [k for k in exercises.keys(9) if k != "09.gpt_step_peak"]


@pytest.mark.parametrize("key", PREDICTIONS)
def test_unanswered_and_malformed(key, capsys):
    unanswered_and_malformed([key], "many", capsys)
    assert exercises.EXERCISES[key].expected is not None


def _right(L, S, A, X, plain_peak):              # the worked solution's count
    return (S - 1) * X + (L - (S - 1) * (L // S)) * A + plain_peak - L * A


def test_build_task_accepts_the_count_that_torchs_checkpoint_sequential_measures(capsys):
    from ckpt_lab.lessons.exercises import lesson09
    for L, S in lesson09.GPT_CASES:                # the judge's measurement, by the count
        A, X, plain = lesson09.gpt_pieces(L)
        assert lesson09.measured_gpt_peak(L, S) == pytest.approx(_right(L, S, A, X, plain), rel=0.005)
    A, X, _ = lesson09.gpt_pieces(12)
    assert 15 < A / X < 22                          # a GPT block: A far above X
    assert exercises.check("09.gpt_step_peak", _right) is True
    assert "(L - S)/L" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda L, S, A, X, p: (S - 1) * A + (L - (S - 1) * (L // S)) * A + p - L * A,
     "not the A bytes"),                                                 # A = X: article 1's view
    (lambda L, S, A, X, p: (S - 1) * X + L / S * A + p - L * A,
     "L // S"),                                                          # L/S, no remainder
    (lambda L, S, A, X, p: (S - 1) * X + (L - (S - 1) * (L // S)) * A,
     "working memory"),                                                  # no backward's work
    (lambda L, S, A, X, p: S * X + (L - (S - 1) * (L // S)) * A + p - L * A,
     "One X off"),                                                       # the first input too
])
def test_build_task_rejects_plausible_wrong_counts(wrong, hint):
    ok, message = exercises.EXERCISES["09.gpt_step_peak"].judge(wrong)
    assert not ok and hint in message, message


def test_build_task_unsolved_or_broken_never_raises(capsys):
    def unsolved(L, S, A, X, plain_peak):
        ...

    def broken(L, S, A, X, plain_peak):
        raise RuntimeError("boom")

    for answer in (None, unsolved, broken, 3, lambda L, S, A, X, p: "many"):
        assert exercises.check("09.gpt_step_peak", answer) is False
    out = capsys.readouterr().out
    assert out.count("not answered yet") == 2 and "boom" in out


def test_the_lesson_ships_the_build_task_unsolved(capsys):
    cell = next(c.source for c in nbformat.read(LESSON, as_version=4).cells
                if 'exercises.check("09.gpt_step_peak"' in c.source)
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
    assert table.add("2.sqrt", "exponent 0.49", "holds") == "holds"
    table.add("2.disk", "0 B", "does not hold", where="elsewhere")
    assert table.counts() == {"holds": 1, "partly holds": 0, "does not hold": 1}
    assert table.rows[0].measured.endswith("— CPU here") and table.rows[1].measured.endswith("— elsewhere")
    assert "2 claims: 1 hold" in table.summary() and "<table>" in table.html()
    # every verdict first, the tally last, in text and in HTML
    lines = table.text().splitlines()
    assert [l.split()[0] for l in lines[:2]] == ["holds", "does"] and lines[-1] == table.summary()
    assert table.html().index("<table>") < table.html().index(table.summary())
    # a claim filed again (its cell run twice) replaces its row in place
    table.add("2.sqrt", "exponent 0.70", "partly holds")
    assert len(table.rows) == 2 and table.rows[0].verdict == "partly holds"
    with pytest.raises(ValueError):
        table.add("2.nothing", "x", "holds")
    with pytest.raises(ValueError):
        table.add("2.sqrt", "x", "maybe")


def test_disk_meter_sees_a_write_and_a_checkpointed_step_writes_nothing(tmp_path):
    path = tmp_path / "x.pt"
    control = audit.disk_writes(lambda: torch.save(torch.zeros(4096), open(path, "wb")))
    assert str(path) in control.opened_for_write
    assert control.written_bytes < 0 or control.written_bytes >= 4096 * 4
    chain, x = _mlp_chain(8, 16), torch.randn(32, 16)
    step = audit.disk_writes(lambda: torch.utils.checkpoint.checkpoint_sequential(
        chain, 4, x, use_reentrant=False).sum().backward())
    assert step.opened_for_write == () and step.new_entries == ()


# The two source articles as they name themselves (neither names an author).
ARTICLES = {
    "1": ("MegaTrain 梯度检查点策略：激活重计算的内存-计算权衡实战",
          "MegaTrain's gradient checkpointing strategy: the memory-compute trade-off of "
          "activation recomputation in practice", "blog2.hotdry.top, 9 April 2026",
          "https://blog2.hotdry.top/posts/2026/04/09/"
          "megatrain-gradient-checkpointing-memory-compute-tradeoff/"),
    "2": ("梯度检查点Gradient Checkpointing显存占用计算",
          "Gradient checkpointing: computing its memory use", "last modified 14 September 2026",
          None),
}


def test_the_lesson_names_both_articles_where_a_reader_can_find_them():
    text = " ".join(" ".join(c.source.split()) for c in nbformat.read(LESSON, as_version=4).cells
                    if c.cell_type == "markdown")
    for number, (title, gloss, published, url) in ARTICLES.items():
        assert f"**Article {number}**: *{title}*" in text
        assert gloss in text and published in text
        assert (url in text) if url else "no address" in text
    assert set(k.split(".")[0] for k in audit.CLAIMS) == set(ARTICLES)
    assert "article A" not in text and "article B" not in text      # 1 and 2: A and B are bytes
