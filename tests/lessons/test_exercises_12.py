"""Lesson 12's three predictions and its build task: right, wrong (diagnosed) and unanswered; the
expected answers worked out independently of the judges."""
import pytest

from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson12


def test_keys_are_the_lessons_predictions():
    assert exercises.keys(12) == ["12.fsdp_halves", "12.ddp_failures", "12.stage_in_flight",
                                  "12.one_f_one_b"]
    predictions = exercises.keys(12)[:3]
    assert all(exercises.EXERCISES[k].expected is not None for k in predictions)


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
    assert "1/D of the rows" in out and "shards the weights" in out and "no buckets" in out
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


# The build task: worked out independently of ckpt_lab's schedule (warm-up, steady state,
# cool-down), and orders a learner may plausibly write instead.
def one_f_one_b(pp, i, M):
    warm = min(pp - i - 1, M)
    order = [("F", j) for j in range(warm)]
    for j in range(M - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", j) for j in range(M - warm, M)]


def gpipe(pp, i, M):
    return [("F", j) for j in range(M)] + [("B", j) for j in range(M)]


def no_warm_up(pp, i, M):            # holds one micro-batch everywhere, at the bubble's price
    return [op for j in range(M) for op in (("F", j), ("B", j))]


def one_too_many(pp, i, M):          # warm-up of pp - i forwards: one stash too many
    warm = min(pp - i, M)
    order = [("F", j) for j in range(warm)]
    for j in range(M - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", j) for j in range(M - warm, M)]


def waits_for_ever(pp, i, M):        # stage 0 wants B(0) before the last stage can run it
    if i == 0:
        return [op for j in range(M) for op in (("F", j), ("B", j))]
    return [("F", j) for j in range(M)] + [("B", j) for j in range(M)]


def stages_disagree(pp, i, M):       # the last stage runs its backwards in reverse
    order = gpipe(pp, i, M)
    return order[:M] + order[M:][::-1] if i == pp - 1 else order


def unsolved(pp, i, M):
    ...


def test_one_f_one_b_is_walked_then_run_on_two_real_stages(capsys):
    assert exercises.check("12.one_f_one_b", one_f_one_b)
    out = capsys.readouterr().out
    assert "held [2, 1] micro-batches, measured, with one process's gradients" in out


@pytest.mark.parametrize("answer, hint", [
    (gpipe, "That is GPipe's order"),
    (one_too_many, "stage 0 holds 3 micro-batches; 1F1B holds at most min(pp - i, M) = 2"),
    (no_warm_up, "against 1F1B's 15"),
    (waits_for_ever, "wait on each other for ever"),
    (stages_disagree, "run their micro-batches in different orders"),
    (unsolved, "not answered yet"),
    (lambda pp, i, M: [("F", 0)], "runs 1 of the"),
    (lambda pp, i, M: 1 / 0, "raised ZeroDivisionError"),
    (one_f_one_b(2, 0, 2), "Pass your function itself"),
])
def test_one_f_one_b_rejects_wrong_orders_with_a_hint_before_any_process(answer, hint, capsys,
                                                                         monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("a wrong order must be refused before the real run")
    monkeypatch.setattr(lesson12, "_run_on_two_stages", no_run)
    assert not exercises.check("12.one_f_one_b", answer)
    assert hint in capsys.readouterr().out


def test_an_unanswered_build_task_says_so_without_raising(capsys):
    assert not exercises.check("12.one_f_one_b", None)
    assert "not answered yet" in capsys.readouterr().out
