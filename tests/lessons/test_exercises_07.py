"""Lesson 7's predictions: each right answer, worked out independently (a hand-made count,
PyTorch's own autocast and FLOP counter), passes; the usual wrong ones get a hint. Its build task
(the largest micro-batch a total budget allows) accepts a bisection and a scan, checked here
against a brute force over the measured step peaks, and rejects the plausible wrong searches
with the hint for each. And the reshaped lessons 4-7 keep the course's terms: "segments of k
blocks" or "every k-th block", never "every k blocks"."""
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson07
from ckpt_lab.training.models import GPTConfig, build_model

from exercise_checks import judge, right_then_wrong, unanswered_and_malformed

ROOT = Path(__file__).resolve().parents[2]
MINE = ["04_the_price", "05_transformers_selective", "06_optimal_schedules",
        "07_combining_techniques"]


def test_accumulation_flops_on_an_independent_gpt():
    model = build_model(GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    x = torch.randint(0, 256, (8, 16))
    counts = []
    for k in (1, 4):
        with FlopCounterMode(display=False) as counter:
            for xm in x.chunk(k):
                (model(xm, xm) / k).backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1]
    assert exercises.EXERCISES["07.accumulation_flops"].expected() == 1.0
    assert judge("07.accumulation_flops", 1.0)
    assert not judge("07.accumulation_flops", 4.0) and not judge("07.accumulation_flops", 0.25)


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
    fits nothing, one lets rows fit that do not divide 16, and leaving the model state out of
    the budget changes an answer."""
    state, G = lesson07.model_state(), lesson07.GLOBAL_BATCH
    assert state == 16 * sum(p.numel() for p in lesson07._search_model().parameters())
    answers = []
    for policy, budget in lesson07.search_cases():
        fits = []                                 # the step peak grows with the rows
        for b in range(1, G + 1):
            if state + lesson07.measured_step_peak(policy, b) > budget:
                break
            fits.append(b)
        brute = max((b for b in fits if G % b == 0), default=0)
        assert lesson07.expected_micro_batch(policy, budget) == brute
        answers.append((brute, max(fits, default=0)))
    assert any(brute == 0 for brute, _ in answers)
    assert any(largest > brute for brute, largest in answers)         # non-divisors fit
    assert {b for b, _ in answers} >= {0, 2, 4, 8}


def test_micro_batch_search_accepts_a_bisection_and_a_scan(capsys):
    right_then_wrong("07.micro_batch_search", bisection,
                     lambda *a: scan(*a, with_state=False), "model state", capsys)
    assert judge("07.micro_batch_search", scan)


@pytest.mark.parametrize("wrong, hint", [
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
    assert len(exercises.keys(7)) == 4


@pytest.mark.parametrize("name", MINE)
def test_segments_of_k_blocks_never_every_k_blocks(name):
    paths = [ROOT / "notebooks" / f"{name}.ipynb",
             ROOT / "notebooks" / "solutions" / f"{name}_solutions.ipynb"]
    for path in paths:
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
        assert not re.search(r"every \d+ blocks|every k blocks|every:\d", text, re.I), path
