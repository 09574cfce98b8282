"""Lesson 4's predictions: each right answer, worked out independently (the paper's formula, a
FLOP count by hand, the committed GPU file), passes; the usual wrong ones get a hint. And the
lesson's text keeps two corrections: Korthikanti et al.'s "over 90%" is credited to sequence
parallelism and selective recomputation together, and no recompute share goes without its basis."""
import json
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson04
from ckpt_lab.training.models import GPTConfig, build_model

from exercise_checks import judge, unanswered_and_malformed

ROOT = Path(__file__).resolve().parents[2]
GPU_FILE = ROOT / "benchmarks" / "results" / "gpu" / "gpu_check.json"
LESSON = ROOT / "notebooks" / "04_the_price.ipynb"


def test_full_flops_without_dropout_skips_each_down_projection():
    """Counted by hand: a plain step (the 72 form) plus one forward of every layer less its MLP
    down projection (8 B s h^2), which early stop skips when no dropout follows it. The 4/3 of
    lesson 0 and Narayanan et al.'s count (with dropout) are wrong answers here."""
    B, s, l, h, V = lesson04.BATCH, lesson04.SEQ, lesson04.LAYERS, lesson04.HIDDEN, 256
    plain = formulas.transformer_flops(l, h, s, B, V)
    layer, down = 24 * B * s * h ** 2 + 4 * B * s ** 2 * h, 8 * B * s * h ** 2
    by_hand = (plain + l * (layer - down)) / plain
    assert exercises.EXERCISES["04.full_flops"].expected() == pytest.approx(by_hand, rel=1e-12)
    assert judge("04.full_flops", by_hand) and judge("04.full_flops", round(by_hand, 2))
    paper = formulas.transformer_flops(l, h, s, B, V, recompute="full") / plain
    for wrong in (2.0, 1.5, 4 / 3, paper, 1.0):
        assert not judge("04.full_flops", wrong)
    assert "early" in exercises.EXERCISES["04.full_flops"].judge(4 / 3)[1]     # the hint names why


def test_selective_re_runs_one_matmul_counted_by_hand():
    model = build_model(GPTConfig(block_size=lesson04.SEQ, n_layer=lesson04.LAYERS,
                                  n_head=lesson04.HEADS, n_embd=lesson04.HIDDEN))
    idx = torch.randint(0, 256, (lesson04.BATCH, lesson04.SEQ))
    counts = {}
    for policy in ("none", "selective"):
        model.set_policy(policy, impl="torch")
        with FlopCounterMode(display=False) as counter:
            model(idx, idx).backward()
        counts[policy] = counter.get_total_flops()
    qk = 2 * lesson04.BATCH * lesson04.SEQ ** 2 * lesson04.HIDDEN
    assert counts["selective"] - counts["none"] == lesson04.LAYERS * qk
    assert exercises.EXERCISES["04.selective_matmuls"].expected() == 1
    assert judge("04.selective_matmuls", 1)
    assert not judge("04.selective_matmuls", 2) and not judge("04.selective_matmuls", 0)


@pytest.mark.skipif(not GPU_FILE.exists(), reason="no committed GPU run")
def test_selective_time_is_read_from_the_committed_run():
    sel = json.loads(GPU_FILE.read_text())["policies"]["policies"]["selective"]
    percent = 100 * (sel["time_ratio"] - 1)
    assert exercises.EXERCISES["04.selective_time"].expected() == pytest.approx(percent)
    assert judge("04.selective_time", round(percent))
    assert not judge("04.selective_time", 100 * (sel["flop_ratio"] - 1))   # the FLOP share
    assert not judge("04.selective_time", 36)


def test_unanswered_and_malformed_never_raise(capsys):
    unanswered_and_malformed(exercises.keys(4), "a lot", capsys)
    assert len(exercises.keys(4)) == 3


def _prose(path):
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "markdown")


def test_over_90_percent_is_credited_to_both_techniques():
    sentences = re.split(r"(?<=[.;])\s", _prose(LESSON).replace("\n", " "))
    cited = [s for s in sentences if "90%" in s]
    assert cited and all("sequence parallelism" in s for s in cited), cited


def test_every_recompute_share_states_its_basis():
    """A percentage of recompute cost is 'of a step's FLOPs' or 'of one forward'."""
    text = _prose(LESSON).replace("\n", " ")
    for m in re.finditer(r"\d+(\.\d+)?%", text):
        around = text[max(0, m.start() - 160):m.end() + 160]
        if "FLOP" in around or "recompute" in around:
            assert ("of a step" in around or "of one forward" in around
                    or "time" in around or "parameters" in around), around


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("04_the_price")
