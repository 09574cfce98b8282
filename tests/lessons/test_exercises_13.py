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
    assert exercises.keys(13) == ["13.low_budget_peak", "13.budget_reused",
                                  "13.saved_for_backward"]
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


def _recorder(count_loss=False, count_inputs=False, use_budget=True):
    """saved_for_backward, written out, with one switch per mistake the judge must catch."""
    import torch
    import torch._functorch.config as functorch_config
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    def saved_for_backward(loss_fn, model, x, budget):
        graphs = []

        def keep(gm, example_inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)
        backend = aot_autograd(fw_compiler=keep, bw_compiler=keep,
                               partition_fn=min_cut_rematerialization_partition)
        with functorch_config.patch(activation_memory_budget=budget if use_budget else 1.0):
            torch.compile(loss_fn, backend=backend)(model, x).backward()
        outputs = graphs[0].graph.find_nodes(op="output")[0].args[0]
        return sum(n.meta["val"].numel() * n.meta["val"].element_size()
                   for n in outputs[0 if count_loss else 1:]
                   if count_inputs or n.op != "placeholder")
    return saved_for_backward


def _stub(loss_fn, model, x, budget):
    ...


def test_saved_for_backward_reads_the_partition_and_diagnoses_wrong_counts(capsys):
    # worked out independently: N = 1,024 rows of H = 256 fp32 are 1 MiB; at 1.0 the forward
    # keeps 15 of them, at 0.5 seven, at 0.1 one (the allocator's count, less the loss)
    assert [lesson13.kept_for_backward(b) for b in lesson13.TASK_BUDGETS] == [15 * MIB, 7 * MIB,
                                                                            1 * MIB]
    assert exercises.check("13.saved_for_backward", _recorder()) is True
    wrong = {"the loss": _recorder(count_loss=True),
             "the inputs": _recorder(count_inputs=True),
             "no budget": _recorder(use_budget=False)}
    for name, answer in wrong.items():
        assert exercises.check("13.saved_for_backward", answer) is False, name
    assert exercises.check("13.saved_for_backward", _stub) is False
    assert exercises.check("13.saved_for_backward", 3) is False
    out = capsys.readouterr().out
    assert "first output is the loss" in out and "placeholders" in out
    assert "as at budget 1.0" in out
    assert "not answered yet" in out and "Pass your function itself" in out


def test_an_unanswered_task_is_told_before_any_measurement(monkeypatch):
    monkeypatch.setattr(lesson13, "measured", lambda b: pytest.fail("measured an unanswered task"))
    assert exercises.check("13.saved_for_backward", _stub) is False


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
