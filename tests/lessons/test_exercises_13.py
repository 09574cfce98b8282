"""Lesson 13's two predictions and its build task: right, wrong (each diagnosed) and unanswered,
with the expected answers worked out independently of the judges."""
import subprocess
import sys

import pytest

from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson13

MIB = 2 ** 20


@pytest.fixture(autouse=True)
def _one(one_thread):
    yield


def test_keys_are_the_lessons_exercises():
    assert exercises.keys(13) == ["13.low_budget_peak", "13.budget_reused", "13.pick_budget"]
    assert all(exercises.EXERCISES[k].expected is not None for k in exercises.keys(13)[:2])


def test_peak_verdict_reads_the_peak_against_the_kept_bytes():
    kept = {1.0: 16, 0.1: 1}
    assert lesson13.peak_verdict(kept, {1.0: 100, 0.1: 10}) == "as much"     # within 2x of 16x
    assert lesson13.peak_verdict(kept, {1.0: 100, 0.1: 60}) == "less"
    assert lesson13.peak_verdict(kept, {1.0: 100, 0.1: 96}) == "not at all"
    assert lesson13.peak_verdict(kept, {1.0: 100, 0.1: 130}) == "not at all"  # it rose


def test_low_budget_peak_is_not_at_all(capsys):
    # worked out independently: N = 1,024 rows of H = 256 fp32 are 1 MiB; at 1.0 each of the
    # L = 8 blocks keeps its Linear's input and its GELU's input, less the batch (no allocation
    # of the step), plus the held loss; at 0.1 one tensor of them
    assert lesson13.measured(1.0)[0] == (2 * 8 - 1) * MIB + 4
    assert lesson13.measured(0.1)[0] == 1 * MIB + 4
    assert lesson13.low_budget_peak() == "not at all"
    assert exercises.check("13.low_budget_peak", "not at all") is True
    assert exercises.check("13.low_budget_peak", "Not at all") is True
    assert exercises.check("13.low_budget_peak", "as much") is False
    assert exercises.check("13.low_budget_peak", "less") is False
    assert exercises.check("13.low_budget_peak", 0.5) is False
    out = capsys.readouterr().out
    assert "fifteen-fold" in out and "It does not fall at all" in out and "Answer one of" in out


def test_budget_reused_is_the_first_compile(capsys):
    assert lesson13.reused_budget() == 1.0
    assert exercises.check("13.budget_reused", 1.0) is True
    assert exercises.check("13.budget_reused", 0.1) is False
    assert exercises.check("13.budget_reused", "1.0") is False
    assert "its guards check the inputs" in capsys.readouterr().out


def _scan(peak_at, limit, budgets):
    for b in budgets:
        if peak_at(b) <= limit:
            return b
    return None


def _least(peak_at, limit, budgets):
    fitting = [b for b in budgets if peak_at(b) <= limit]
    return fitting[-1] if fitting else None


def _measure_all(peak_at, limit, budgets):
    fitting = [b for b in budgets if peak_at(b) <= limit]
    return fitting[0] if fitting else None


def _bisect(peak_at, limit, budgets):
    """Assumes the step peak falls as the budget falls: the wrong model of the partitioner."""
    if peak_at(budgets[0]) <= limit:
        return budgets[0]
    lo, hi = 0, len(budgets) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if peak_at(budgets[mid]) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return budgets[lo] if peak_at(budgets[lo]) <= limit else None


def _stub(peak_at, limit, budgets):
    ...


def test_pick_budget_accepts_the_scan_and_diagnoses_wrong_searches(capsys):
    # the measured peaks are not monotone in the budget: least at a middle budget
    peaks = [lesson13.measured(b)[1] for b in lesson13.TASK_BUDGETS]
    low = peaks.index(min(peaks))
    assert 0 < low < len(peaks) - 1 and peaks[-1] > peaks[0]
    assert exercises.check("13.pick_budget", _scan) is True
    for wrong in (_least, _measure_all, _bisect, _stub, 3):
        assert exercises.check("13.pick_budget", wrong) is False, wrong
    out = capsys.readouterr().out
    assert "recomputes less" in out                       # the least budget that fits
    assert "where 1 suffice" in out                       # measured every budget
    assert "a bisection can skip the answer" in out
    assert "not answered yet" in out and "Pass your function itself" in out


def test_an_unanswered_task_is_told_before_any_compile(monkeypatch):
    monkeypatch.setattr(lesson13, "measured", lambda b: pytest.fail("measured an unanswered task"))
    assert exercises.check("13.pick_budget", _stub) is False


def test_in_your_code_budget_line_runs_when_pasted():
    """Lesson 13's copyable block sets the compile budget; pasted into a fresh interpreter, its
    imports must make torch._functorch.config reachable (bare `import torch` does not)."""
    from exercise_checks import in_your_code
    code = in_your_code("13_compile_under_a_memory_budget")
    lines = [line for line in code.splitlines()
             if line.startswith(("import ", "from ", "torch._functorch.config."))]
    assert any(line.startswith("torch._functorch.config.activation_memory_budget") for line in lines)
    assert "use_reentrant=False" in code
    run = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
