"""Lesson 7's predictions: each right answer, worked out independently (a hand-made count,
PyTorch's own autocast and FLOP counter), passes; the usual wrong ones get a hint. And the
reshaped lessons 4-7 keep the course's terms: "segments of k blocks" or "every k-th block",
never "every k blocks"."""
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson07
from ckpt_lab.training.models import GPTConfig, build_model

from exercise_checks import judge, unanswered_and_malformed

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


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(7), ["a", "list"], capsys)
    assert len(exercises.keys(7)) == 3


@pytest.mark.parametrize("name", MINE)
def test_segments_of_k_blocks_never_every_k_blocks(name):
    paths = [ROOT / "notebooks" / f"{name}.ipynb",
             ROOT / "notebooks" / "solutions" / f"{name}_solutions.ipynb"]
    for path in paths:
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
        assert not re.search(r"every \d+ blocks|every k blocks|every:\d", text, re.I), path
