"""Lesson 2's predictions and build task: measured answers, diagnosed wrong ones, and the
correctness catalogue the grid is drawn from."""
import pytest
import torch
import torch.utils.checkpoint

from ckpt_lab import checkpoint
from ckpt_lab.checkpoint import minimal_hooks
from ckpt_lab.lessons import correctness, exercises
from ckpt_lab.lessons.exercises import lesson02

from exercise_checks import right_then_wrong

FAULTS = ["dropout (RNG)", "input edited after forward", "saved tensor edited inside",
          "optimizer step before backward (bias only)", "RReLU fills a saved buffer",
          "recompute differs (metadata)"]


def _torch_checkpoint(fn, x):
    return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)


def test_the_measured_answers():
    assert lesson02.kept_tensors() == 1.0
    assert lesson02.conv_only_saving() == 0.0
    assert lesson02.resblock_kept("none") == 3 * lesson02.resblock_kept("whole branch") + 2 * 8 * 4
    assert lesson02.recompute_bias() == "the new bias"


@pytest.mark.parametrize("key, right, wrong, hint", [
    ("02.kept_tensors", 1, 4, "plain chain"),
    ("02.kept_tensors", 1.0, 0, "output is alive"),
    ("02.conv_only_saving", 0, 1 / 3, "checkpoint keeps its input"),
    ("02.conv_only_saving", 0.0, 2 / 3, "whole branch"),
    ("02.recompute_bias", "the new bias", "the old bias", "the bias is no input"),
    ("02.recompute_bias", "The new bias", "refuses", "version counters guard saved tensors only"),
    ("02.my_checkpoint", _torch_checkpoint, minimal_hooks, "get_rng_state"),
    ("02.my_checkpoint", _torch_checkpoint, lambda fn, x: fn(x), "keeps"),
])
def test_right_and_wrong(key, right, wrong, hint, capsys):
    right_then_wrong(key, right, wrong, hint, capsys)


def test_the_bias_prediction_asks_for_one_of_its_answers(capsys):
    assert exercises.check("02.recompute_bias", "the bias") is False
    assert exercises.check("02.recompute_bias", 1) is False
    assert capsys.readouterr().out.count("Answer one of") == 2


def test_unanswered_malformed_and_raising_answers_never_raise(capsys):
    for key in exercises.keys(2):
        assert exercises.check(key, None) is False
    assert exercises.check("02.my_checkpoint", 3) is False
    assert exercises.check("02.kept_tensors", "one") is False

    def broken(fn, x):
        raise RuntimeError("boom")
    assert exercises.check("02.my_checkpoint", broken) is False
    assert "boom" in capsys.readouterr().out

    def stub(fn, x):
        ...
    assert exercises.check("02.my_checkpoint", stub) is False
    assert "not answered yet" in capsys.readouterr().out
    assert exercises.keys(2) == ["02.kept_tensors", "02.recompute_bias", "02.conv_only_saving",
                                 "02.my_checkpoint"]


def test_the_catalogue_grid_against_ckpt_lab_and_plain_autograd():
    table = correctness.grid(correctness.FAULTS, {
        "plain": correctness.WRAPS["plain"], "ckpt_lab": lambda f, *a: checkpoint(f, *a),
        "minimal hooks": minimal_hooks})
    assert list(table) == FAULTS
    assert all(row["ckpt_lab"] == "right" or row["ckpt_lab"].startswith("refuses (CheckpointError")
               for row in table.values())
    assert [row["minimal hooks"] for row in table.values()][:5] == ["WRONG, silently"] * 5
    assert table["optimizer step before backward (bias only)"]["plain"] == "right"   # no op saves a bias
    assert table["saved tensor edited inside"]["plain"] == "refuses (RuntimeError)"
    assert table["dropout (RNG)"]["plain"] == "right"


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("02_checkpointing_from_scratch")
