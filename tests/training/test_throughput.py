"""Throughput at equal global batch: the budget search against brute force, the setups a budget
gives, FLOPs per step, and measure_throughput's rows (tiny sizes; times not judged)."""
import pytest

from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config
from ckpt_lab.training.throughput import (Setup, budget_setups, largest_micro_batch,
                                          measure_throughput, micro_batch_sizes, step_flops,
                                          step_peak_bytes)


@pytest.fixture(scope="module")
def gpt(one_thread):
    cfg = get_config("gpt-tiny")
    batches = TextBatches(load_corpus(), 8, cfg.block_size, seed=0)
    x, y = batches.get(0)
    return build_model(cfg), batches, x, y


def test_micro_batch_sizes_are_the_divisors():
    assert micro_batch_sizes(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(ValueError, match="positive int"):
        micro_batch_sizes(0)


def test_peak_grows_with_the_micro_batch_and_shrinks_with_checkpointing(gpt):
    model, _, x, y = gpt
    peaks = {p: [step_peak_bytes(model, x, y, p, m) for m in (1, 2, 4, 8)]
             for p in ("none", "every", "selective")}
    for row in peaks.values():
        assert row == sorted(row) and len(set(row)) == 4
    assert all(e < s < n for n, e, s in zip(peaks["none"], peaks["every"], peaks["selective"]))
    assert all(p.grad is None for p in model.parameters())     # gradients put back


def test_largest_micro_batch_is_the_brute_force_answer(gpt):
    model, _, x, y = gpt
    for policy in ("none", "every"):
        peaks = {m: step_peak_bytes(model, x, y, policy, m) for m in micro_batch_sizes(8)}
        for budget in sorted(peaks.values()) + [min(peaks.values()) - 1, max(peaks.values()) + 1]:
            fits = [m for m, p in peaks.items() if p <= budget]
            assert largest_micro_batch(model, x, y, policy, budget) == (max(fits) if fits else None)


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused(gpt):
    model, batches, x, y = gpt
    with pytest.raises(ValueError, match=r"micro_batch must divide the global batch of 8 rows"):
        step_peak_bytes(model, x, y, "none", 3)
    with pytest.raises(ValueError, match="budget_bytes"):
        largest_micro_batch(model, x, y, "none", -1)
    with pytest.raises(ValueError, match="clock"):
        measure_throughput(model, batches, [Setup("none", 8)], clock="gpu")


def test_budget_setups_compare_what_fits(gpt):
    model, _, x, y = gpt
    budget = step_peak_bytes(model, x, y, "none", 2)
    setups = budget_setups(model, x, y, budget, reference=True)
    by = {(s.policy, s.micro_batch): s for s in setups}
    every = largest_micro_batch(model, x, y, "every", budget)
    assert every > 2
    assert {("none", 2), ("none", 1), ("every", every), ("every", 2), ("none", every)} <= set(by)
    assert ("selective", largest_micro_batch(model, x, y, "selective", budget)) in by
    assert "reference" in by["none", every].label
    assert ("none", every) not in {(s.policy, s.micro_batch) for s in
                                   budget_setups(model, x, y, budget)}


def test_accumulation_adds_no_flops_and_full_recompute_adds_one_forward_of_the_blocks(gpt):
    model, _, x, y = gpt
    plain = {m: step_flops(model, x, y, "none", m) for m in (1, 2, 8)}
    assert len(set(plain.values())) == 1
    every = step_flops(model, x, y, "every", 2)
    assert step_flops(model, x, y, "every", 8) == every > plain[8]
    # the recompute is one forward of the blocks: under a third of the plain step's FLOPs
    assert 1 < every / plain[8] < 4 / 3 + 1e-9


def test_measure_throughput_rows(gpt):
    model, batches, x, y = gpt
    budget = step_peak_bytes(model, x, y, "none", 4)
    setups = [Setup("none", 4), Setup("every", 8, "checkpointed"), Setup("none", 8)]
    rows = measure_throughput(model, batches, setups, budget, repeats=2, warmup=1, clock="cpu")
    assert [r.label for r in rows] == ["none, micro-batch 4", "checkpointed", "none, micro-batch 8"]
    assert [r.accumulation for r in rows] == [2, 1, 1]
    assert [r.fits for r in rows] == [True, True, False]
    for r in rows:
        assert len(r.times) == 2 and r.seconds > 0
        assert r.tokens_per_s == pytest.approx(r.tokens_per_step / r.seconds)
        assert r.tokens_per_step == 8 * batches.block_size
    assert rows[0].step_flops == rows[2].step_flops < rows[1].step_flops
