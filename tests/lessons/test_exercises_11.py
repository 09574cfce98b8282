"""Lesson 11's three predictions: right, wrong (each side diagnosed) and unanswered, with the
expected answers measured independently of the judges."""
import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from ckpt_lab.lessons import exercises  # noqa: E402
from ckpt_lab.lessons.exercises import lesson11  # noqa: E402


@pytest.fixture(autouse=True)
def _one(one_thread):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def test_keys_are_the_lessons_predictions():
    assert exercises.keys(11) == ["11.peak_drop", "11.trap_adapters", "11.manual_core"]
    assert all(exercises.EXERCISES[k].expected is not None for k in exercises.keys(11))


def test_peak_drop_is_measured_and_judged_on_a_log_scale(capsys):
    factor = lesson11.peak_drop()
    assert 1.5 < factor < 4          # the peak falls, by far less than the kept bytes (x7.5)
    assert exercises.check("11.peak_drop", round(factor, 2)) is True      # as the ledger prints it
    assert exercises.check("11.peak_drop", 7.5) is False                 # the kept bytes' factor
    assert exercises.check("11.peak_drop", 1.0) is False
    assert exercises.check("11.peak_drop", None) is False
    out = capsys.readouterr().out
    assert "Too high" in out and "Too low" in out and "not answered yet" in out


def test_trap_adapters_counts_layer_zero_out():
    # worked out independently: 6 layers x (A, B) x (q_proj, v_proj); layer 0's four get nothing
    assert lesson11.trap_adapters_with_grad() == 6 * 4 - 4
    assert exercises.check("11.trap_adapters", 20) is True
    assert exercises.check("11.trap_adapters", 24) is False
    assert exercises.check("11.trap_adapters", 16) is False
    assert exercises.check("11.trap_adapters", "twenty") is False


def test_manual_core_frees_its_softmax_output_and_mask(capsys):
    percent, block = lesson11.core_freed_percent("manual"), 661504
    # worked out independently (B 2, heads 4, T 64, fp32): the softmax output B x heads x T x T
    # and the causal mask T x T bool, of what the block keeps (formulas.gpt_block_terms)
    from ckpt_lab import formulas
    terms = formulas.gpt_block_terms(2, 64, 64, 4, 4, False)
    freed = terms["softmax output"] + terms["causal mask (~mask, bool)"]
    assert freed == 2 * 4 * 64 * 64 * 4 + 64 * 64 and sum(terms.values()) == block
    assert abs(percent - 100 * freed / block) < 1e-9            # 20.4%
    assert exercises.check("11.manual_core", round(percent)) is True
    assert exercises.check("11.manual_core", 24) is True
    assert exercises.check("11.manual_core", 37) is False        # Megatron's 5as/h share, fp16 + dropout
    assert exercises.check("11.manual_core", 0.4) is False       # SDPA's answer
    assert exercises.check("11.manual_core", -1) is False
    out = capsys.readouterr().out
    assert "Too much" in out and "Too little" in out and "with SDPA" in out


def test_sdpa_core_frees_only_the_log_sum_exp_rows():
    percent = lesson11.core_freed_percent("sdpa")
    # the fused kernel's log-sum-exp, B x heads x T fp32, of what the block keeps
    assert 0 < percent < 1


def test_predictions_record_then_reveal(capsys):
    guess = exercises.predict("11.trap_adapters", 20)
    assert "prediction recorded" in capsys.readouterr().out
    assert guess.reveal() is True
    assert exercises.predict("11.manual_core", None).reveal() is False


def test_in_your_code_budget_line_runs_when_pasted():
    """Lesson 11's copyable block sets the compile budget; pasted into a fresh interpreter, its
    imports must make torch._functorch.config reachable (bare `import torch` does not)."""
    import subprocess
    import sys

    from exercise_checks import in_your_code
    code = in_your_code("11_checkpointing_in_your_stack")
    lines = [line for line in code.splitlines()
             if line.startswith(("import ", "from ", "torch._functorch.config."))]
    assert any(line.startswith("torch._functorch.config.activation_memory_budget") for line in lines)
    run = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
