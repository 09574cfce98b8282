"""Lesson 10's predictions, on its default model: each judge accepts the answer found another way
(counted by hand, by brute force over every plan and a measurement, by PyTorch's checkpoint) and
rejects the diagnostic wrong ones; the default model is the one the lesson's cell builds. Its build
task (fit any model to a budget) accepts a worked solution, checked here by its own measurement,
and rejects plausible wrong ones with a hint."""
import itertools
import types
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from ckpt_lab import planner
from ckpt_lab.lessons import exercises, widgets

from exercise_checks import judge, unanswered_and_malformed

LESSON = Path(__file__).resolve().parents[2] / "notebooks" / "10_your_own_model.ipynb"


def test_the_default_model_is_the_lessons():
    cell = next(c.source for c in nbformat.read(LESSON, as_version=4).cells
                if "BRING YOUR MODEL HERE" in c.source)
    space = {"torch": torch, "nn": nn, "device": torch.device("cpu"),
             "size": types.SimpleNamespace(width=exercises.lesson10.WIDTH,
                                           batch=exercises.lesson10.BATCH)}
    exec(cell, space)
    ours = exercises.lesson10.default_model()
    assert str(space["model"]) == str(ours)
    assert all(torch.equal(a, b) for a, b in zip(space["model"].parameters(), ours.parameters()))
    assert space["make_input"]().shape == (exercises.lesson10.BATCH, 64)


def test_largest_layer_counted_by_hand():
    b, w = exercises.lesson10.BATCH, exercises.lesson10.WIDTH
    widths = [64, 4 * w, 4 * w, w // 2, 8 * w, w, w]
    # a block keeps its input (not the chain's own input), GELU's input and dropout's float mask
    kept = [(widths[i] if i else 0) + 2 * widths[i + 1] for i in range(6)] + [widths[6]]
    by_hand = max(range(7), key=lambda i: kept[i])
    assert by_hand == exercises.lesson10.largest_layer() == 3
    assert [p.act_bytes for p in exercises.lesson10.default_profile()] == [4 * b * k for k in kept]
    assert judge("10.largest_layer", 3)
    for wrong in (1, 4, 0, 6):
        assert not judge("10.largest_layer", wrong)
    assert not judge("10.largest_layer", 7) and not judge("10.largest_layer", 2.5)


def test_least_peak_by_brute_force_and_a_measurement():
    profile = list(exercises.lesson10.default_profile())
    n = len(profile)
    plans = [[0, *rest] for k in range(n) for rest in itertools.combinations(range(1, n), k)]
    best = min(plans, key=lambda p: planner.step_peak_bytes(p, profile))
    none = planner.step_peak_bytes([0], profile)
    assert planner.step_peak_bytes(best, profile) == planner.minimum_peak(profile) < none
    model = exercises.lesson10.default_model().train()
    measured = widgets.measure_plan_peak(list(model), torch.randn(exercises.lesson10.BATCH, 64), best)
    assert abs(measured / planner.step_peak_bytes(best, profile) - 1) < 0.03


def test_finest_plan_by_measurement():
    """Independent of the judge's step model: both plans measured with track_memory on the
    default model; checkpoints around the largest layer (which reach the least peak any plan
    reaches) peak lower than one before every layer."""
    every, around = exercises.lesson10.finest_and_around()
    assert every == list(range(7)) and around == [0, 3, 4]
    model = exercises.lesson10.default_model().train()
    x = torch.randn(exercises.lesson10.BATCH, 64)
    peak = {name: widgets.measure_plan_peak(list(model), x, starts)
            for name, starts in (("every layer", every), ("around the largest", around))}
    assert peak["around the largest"] < 0.9 * peak["every layer"]
    profile = list(exercises.lesson10.default_profile())
    assert planner.step_peak_bytes(around, profile) == planner.minimum_peak(profile)
    assert exercises.lesson10.finest_plan() == "around the largest"
    assert judge("10.finest_plan", "around the largest") and judge("10.finest_plan", "Around the largest")
    for wrong in ("every layer", "same"):
        ok, hint = exercises.EXERCISES["10.finest_plan"].judge(wrong)
        assert not ok and "layer 3" in hint
    assert not judge("10.finest_plan", 0.5)


def _rng_by_torch():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    x = torch.randn(16, 8, requires_grad=True)
    grads = []
    for keep in (None, True, False):
        m.zero_grad()
        torch.manual_seed(1)
        out = m(x) if keep is None else torch.utils.checkpoint.checkpoint(
            m, x, use_reentrant=False, preserve_rng_state=keep)
        out.sum().backward()
        grads.append(m[0].weight.grad.clone())
    return torch.equal(grads[0], grads[1]), not torch.equal(grads[0], grads[2])


def test_rng_replay_by_torchs_checkpoint():
    exact_with, differs_without = _rng_by_torch()
    assert exact_with and differs_without
    assert exercises.lesson10.rng_matters_for_dropout() is differs_without
    assert judge("10.rng_replay", True) and not judge("10.rng_replay", False)
    assert not judge("10.rng_replay", "yes")


PREDICTIONS = [k for k in exercises.keys(10) if k != "10.fit_budget"]


@pytest.mark.parametrize("key", PREDICTIONS)
def test_unanswered_and_malformed(key, capsys):
    unanswered_and_malformed([key], "nonsense", capsys)
    assert exercises.EXERCISES[key].expected is not None


# ----------------------------------------------------------------------- the build task, fit(...)
def _fit(model, step, budget_bytes):             # the worked solution: the lists' most repeated class
    from collections import Counter
    from ckpt_lab import checkpoint_modules
    from ckpt_lab.plan.module_planner import plan_modules
    kinds = Counter(type(b) for ml in model.modules() if isinstance(ml, nn.ModuleList) for b in ml)
    plan = plan_modules(model, kinds.most_common(1)[0][0], step, budget_bytes)
    return checkpoint_modules(model, plan.select)


def test_fit_is_accepted_and_does_what_the_judge_says(capsys):
    from ckpt_lab import checkpoint_modules
    from ckpt_lab.lessons.exercises import lesson10
    assert exercises.check("10.fit_budget", _fit) is True
    assert "✓" in capsys.readouterr().out
    # checked here without the judge: on the encoder, at a budget between the plain step's peak
    # and the all-checkpointed one, fit checkpoints some blocks, not all, and the step fits
    name, model, step, block = lesson10.fit_cases()[1]
    plain = lesson10._step_peak(model, step)
    with checkpoint_modules(model, block):
        everything = lesson10._step_peak(model, step)
    budget = (plain + everything) // 2
    with _fit(model, step, budget) as handle:
        peak = lesson10._step_peak(model, step)
    assert everything < budget < plain and peak <= budget
    assert 0 < len(handle.names) < 4 and not handle.active


def _plan_all(model, step, budget_bytes, **kwargs):
    from ckpt_lab import checkpoint_modules
    from ckpt_lab.training.models import Block
    from ckpt_lab.plan.module_planner import plan_modules
    plan = plan_modules(model, (Block, nn.TransformerEncoderLayer), step, budget_bytes)
    return plan, checkpoint_modules


def _no_replay(model, step, budget_bytes):
    plan, apply = _plan_all(model, step, budget_bytes)
    return apply(model, plan.select, preserve_rng_state=False)


def _first_block_only(model, step, budget_bytes):
    plan, apply = _plan_all(model, step, budget_bytes)
    return apply(model, plan.select[:1])


def _every_block(model, step, budget_bytes):
    from ckpt_lab import checkpoint_modules
    from ckpt_lab.training.models import Block
    return checkpoint_modules(model, (Block, nn.TransformerEncoderLayer))


def _gpt_blocks_only(model, step, budget_bytes):
    from ckpt_lab import checkpoint_modules
    from ckpt_lab.training.models import Block
    from ckpt_lab.plan.module_planner import plan_modules
    return checkpoint_modules(model, plan_modules(model, Block, step, budget_bytes).select)


def _the_plan(model, step, budget_bytes):
    return _plan_all(model, step, budget_bytes)[0]


@pytest.mark.parametrize("wrong, hint", [
    (_no_replay, "random generator"),           # dropout draws new masks in the recompute
    (_first_block_only, "over the budget"),     # too few blocks
    (_every_block, "recomputed for nothing"),   # more blocks than the budget needs
    (_gpt_blocks_only, "nn.TransformerEncoder, fit raised ValueError"),   # one model's class
    (_the_plan, "return the handle"),           # the plan, not applied
])
def test_fit_rejects_plausible_wrong_answers(wrong, hint):
    ok, message = exercises.EXERCISES["10.fit_budget"].judge(wrong)
    assert not ok and hint in message, message


def test_fit_unsolved_or_broken_never_raises_and_leaves_torch_as_it_was(capsys):
    def unsolved(model, step, budget_bytes):
        ...

    def broken(model, step, budget_bytes):
        raise RuntimeError("boom")

    threads = torch.get_num_threads()
    for answer in (None, unsolved, broken, 3):
        assert exercises.check("10.fit_budget", answer) is False
    out = capsys.readouterr().out
    assert out.count("not answered yet") == 2 and "boom" in out
    assert torch.get_num_threads() == threads


def test_the_lesson_ships_the_build_task_unsolved(capsys):
    cell = next(c.source for c in nbformat.read(LESSON, as_version=4).cells
                if 'exercises.check("10.fit_budget"' in c.source)
    exec(cell, {"exercises": exercises})
    assert "not answered yet" in capsys.readouterr().out
