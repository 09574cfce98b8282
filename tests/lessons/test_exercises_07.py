"""Lesson 7's predictions: each right answer, worked out independently (a hand-made count,
PyTorch's own autocast, the formulas), passes; the usual wrong ones get a hint. Its
build task (the largest micro-batch a total budget allows, in few measurements) accepts a
bisection, checked here against a brute force over the measured step peaks, and rejects the
plausible wrong searches, a scan that measures too many sizes among them, with the hint for
each. And the reshaped lessons 4-7 keep the course's terms: "segments of k blocks" or "every
k-th block", never "every k blocks". The judges measure small models on one thread, once per
setting, so the file runs in seconds."""
import re
from pathlib import Path

import nbformat
import pytest

from ckpt_lab import build_model, get_config
from ckpt_lab.lessons import combining, exercises
from ckpt_lab.lessons.exercises import lesson07
from ckpt_lab.training.throughput import micro_batch_sizes

from exercise_checks import judge, right_then_wrong, unanswered_and_malformed

ROOT = Path(__file__).resolve().parents[2]
MINE = ["04_the_price", "05_transformers_selective", "06_optimal_schedules",
        "07_combining_techniques"]


def test_accumulation_cuts_less_with_checkpointing_by_the_formulas():
    """The formulas (lesson 5's terms), apart from the judge's measurement, say the same: the
    share of the step peak that 4 micro-batches leave is larger with every block checkpointed;
    and the judge's measured shares lie within 6% of theirs."""
    cfg = get_config("gpt-cpu", block_size=lesson07.SEQ, n_layer=lesson07.LAYERS,
                     n_embd=lesson07.HIDDEN, n_head=lesson07.HEADS, dropout=0.0)
    cut = {}
    for policy in ("none", "every"):
        model = build_model(cfg, policy=policy)
        cut[policy] = (combining.predicted_peak(model, lesson07.BATCH // 4)
                       / combining.predicted_peak(model, lesson07.BATCH))
        assert lesson07.accumulation_cut(policy) == pytest.approx(cut[policy], rel=0.06)
    assert cut["every"] > 1.05 * cut["none"]
    assert exercises.EXERCISES["07.accumulation_with_ckpt"].expected() == "less"
    assert judge("07.accumulation_with_ckpt", "less")
    assert not judge("07.accumulation_with_ckpt", "more")
    assert not judge("07.accumulation_with_ckpt", " The  same ")
    assert not judge("07.accumulation_with_ckpt", "fewer")        # not one of the three


def test_autocast_ratio_lies_between_a_cast_model_and_fp32():
    ratio = exercises.EXERCISES["07.autocast_ratio"].expected()
    assert 0.5 < ratio < 1
    assert judge("07.autocast_ratio", round(ratio, 2))
    assert not judge("07.autocast_ratio", 0.5) and not judge("07.autocast_ratio", 1.0)


def test_bf16_costs_more_at_one_row_with_every_block_checkpointed():
    assert lesson07.bf16_small_batch_ratio() > 1.02
    assert exercises.EXERCISES["07.bf16_small_batch"].expected() == "above"
    assert judge("07.bf16_small_batch", "above") and judge("07.bf16_small_batch", " Above ")
    assert not judge("07.bf16_small_batch", "below")
    assert not judge("07.bf16_small_batch", "more")          # not one of the three: a hint


def bisection(step_peak, state, global_batch, budget):
    """The solutions notebook's search: bisect the divisors for the room the state leaves."""
    sizes = [b for b in range(1, global_batch + 1) if global_batch % b == 0]
    lo, hi = 0, len(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if step_peak(sizes[mid]) <= budget - state else (lo, mid)
    return sizes[lo - 1] if lo else 0


def scan(step_peak, state, global_batch, budget, divisors=True, with_state=True):
    """From the largest micro-batch down; the wrong variants skip the divisor test or the state."""
    for b in range(global_batch, 0, -1):
        if (not divisors or global_batch % b == 0) and \
                with_state * state + step_peak(b) <= budget:
            return b
    return 0


def test_the_search_cases_each_need_the_whole_rule():
    """Brute force over the measured step peaks gives the judge's answers; among the cases, one
    fits nothing, one lets rows fit that do not divide the global batch, the two global batches
    give different answers for one budget, and leaving the model state out of the budget
    changes an answer."""
    state = lesson07.model_state()
    assert state == 16 * sum(p.numel() for p in lesson07._search_model().parameters())
    answers = {}
    for policy, g, budget in lesson07.search_cases():
        fits = []                                 # the step peak grows with the rows
        for b in range(1, g + 1):
            if state + lesson07.measured_step_peak(policy, b) > budget:
                break
            fits.append(b)
        brute = max((b for b in fits if g % b == 0), default=0)
        assert lesson07.expected_micro_batch(policy, g, budget) == brute
        assert scan(lambda b: lesson07.measured_step_peak(policy, b), 0, g, budget) >= brute
        answers[policy, g, budget] = (brute, max(fits, default=0))
    assert any(brute == 0 for brute, _ in answers.values())
    assert any(largest > brute for brute, largest in answers.values())    # non-divisors fit
    assert {b for b, _ in answers.values()} >= {0, 2, 4, 6, 8, 12}
    assert any(answers[p, 16, b][0] != answers.get((p, 12, b), (None,))[0]
               for p, g, b in answers if g == 16 and (p, 12, b) in answers)


def test_a_bisection_over_the_divisors_measures_few_enough():
    assert [lesson07.most_measurements(g) for g in (16, 12, 1)] == [3, 3, 1]
    assert [len(micro_batch_sizes(g)) for g in lesson07.GLOBAL_BATCHES] == [5, 6]


def test_micro_batch_search_accepts_a_bisection(capsys):
    right_then_wrong("07.micro_batch_search", bisection,
                     lambda *a: scan(*a, with_state=False), "model state", capsys)


@pytest.mark.parametrize("wrong, hint", [
    (scan, "measured 4 sizes"),                                   # right answers, too many steps
    (lambda *a: scan(*a, divisors=False), "do not divide the global batch"),
    (lambda peak, state, g, budget: int(state + peak(1) <= budget), "but so do"),
    (lambda peak, state, g, budget: None, "not answered yet"),
    (lambda peak, state, g, budget: peak(0), "raised ValueError"),
    (lambda peak, state, g, budget: 4.0, "whole number of rows"),
    (16, "Pass your function itself"),
])
def test_micro_batch_search_rejects_plausible_wrong_searches(wrong, hint):
    ok, message = exercises.EXERCISES["07.micro_batch_search"].judge(wrong)
    assert not ok and hint in message


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(7), ["a", "list"], capsys)
    assert exercises.keys(7) == ["07.autocast_ratio", "07.accumulation_with_ckpt",
                                 "07.bf16_small_batch", "07.micro_batch_search"]


@pytest.mark.parametrize("name", MINE)
def test_segments_of_k_blocks_never_every_k_blocks(name):
    paths = [ROOT / "notebooks" / f"{name}.ipynb",
             ROOT / "notebooks" / "solutions" / f"{name}_solutions.ipynb"]
    for path in paths:
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
        assert not re.search(r"every \d+ blocks|every k blocks|every:\d", text, re.I), path
