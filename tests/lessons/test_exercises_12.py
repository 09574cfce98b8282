"""Lesson 12's three predictions: right, wrong (diagnosed) and unanswered; the expected answers
worked out independently of the judges."""
import pytest

from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson12


def test_keys_are_the_lessons_predictions():
    assert exercises.keys(12) == ["12.fsdp_halves", "12.ddp_failures", "12.stage_in_flight"]
    assert all(exercises.EXERCISES[k].expected is not None for k in exercises.keys(12))


def test_fsdp_halves_state_and_activations(capsys):
    assert lesson12.fsdp_halving_bands() == {"weights", "gradients", "Adam", "activations"}
    assert exercises.check("12.fsdp_halves", {"weights", "gradients", "adam", "activations"})
    assert exercises.check("12.fsdp_halves", ["Weights", "Gradients", "Adam",
                                              "activations & buffers"])    # as the bars name it
    assert not exercises.check("12.fsdp_halves", {"activations"})          # DDP's answer
    assert not exercises.check("12.fsdp_halves", {"weights", "gradients", "Adam"})
    assert not exercises.check("12.fsdp_halves", {"weights", "gradients", "Adam", "activations",
                                                  "buckets"})
    assert not exercises.check("12.fsdp_halves", {"memory"})
    assert not exercises.check("12.fsdp_halves", None)
    out = capsys.readouterr().out
    assert "B/N of the rows" in out and "shards the weights" in out and "no buckets" in out
    assert "Unknown bands" in out


def test_ddp_failures_are_measured(capsys):
    assert lesson12.failing_ddp_configurations() == {1, 4}      # find_unused; frozen embedding
    assert exercises.check("12.ddp_failures", {1, 4})
    assert exercises.check("12.ddp_failures", [4, 1])
    assert not exercises.check("12.ddp_failures", {1})
    assert not exercises.check("12.ddp_failures", {1, 2, 4})
    assert not exercises.check("12.ddp_failures", {6})
    out = capsys.readouterr().out
    assert "4: a reentrant checkpoint whose input needs no grad" in out
    assert "[2] ran both steps" in out


def test_stage_in_flight_walks_the_schedule(capsys):
    # worked out independently: stage r of p holds p - r under 1F1B, whatever the micro-batches
    assert lesson12.held_by_stage() == (4, 3, 2, 1)
    assert lesson12.first_and_last_stage() == (4, 1)
    assert exercises.check("12.stage_in_flight", (4, 1))
    assert not exercises.check("12.stage_in_flight", (8, 8))     # GPipe's answer
    assert not exercises.check("12.stage_in_flight", (3, 1))
    assert not exercises.check("12.stage_in_flight", 4)
    assert "GPipe's answer" in capsys.readouterr().out
