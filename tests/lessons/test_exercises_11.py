"""Lesson 11's three predictions and its build task: right, wrong (each side diagnosed) and
unanswered, with the expected answers measured independently of the judges."""
import os
import warnings

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

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
    assert exercises.keys(11) == ["11.peak_drop", "11.trap_adapters", "11.every_second_share",
                                  "11.every_second_matmul"]
    predictions = exercises.keys(11)[:3]
    assert all(exercises.EXERCISES[k].expected is not None for k in predictions)


def test_peft_is_pinned_and_its_lora_is_the_trap_lessons_model():
    """requirements.txt pins peft, so the lesson measures peft's LoRA; the judge measures the
    same model (24 trainable adapter tensors, random B so that A's gradient is not zero)."""
    from ckpt_lab.lessons import hf
    pytest.importorskip("peft")
    lora = hf.lora_llama(6)
    assert type(lora).__name__ == "PeftModel"
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert len(trainable) == 24 and all("lora_" in n for n in trainable)
    assert all(p.abs().sum() > 0 for n, p in lora.named_parameters() if "lora_B" in n)


def test_peak_drop_is_measured_and_judged_on_a_log_scale(capsys):
    factor = lesson11.peak_drop()
    assert 3 < factor < 6            # the step peak (activations) falls, by less than the kept
                                     # bytes (x7.5), and by more than with the gradients in it
    assert exercises.check("11.peak_drop", round(factor, 2)) is True      # as the ledger prints it
    assert exercises.check("11.peak_drop", 7.5) is False                 # the kept bytes' factor
    assert exercises.check("11.peak_drop", 1.0) is False
    assert exercises.check("11.peak_drop", None) is False
    out = capsys.readouterr().out
    assert "Too high" in out and "Too low" in out and "not answered yet" in out


def test_trap_adapters_counts_layer_zero_out():
    # worked out independently: 6 layers x (A, B) x (q_proj, v_proj); layer 0's four get nothing
    assert lesson11.trap_adapters_with_grad() == 6 * 4 - 4
    assert lesson11.trap_adapters_with_grad(use_peft=False) == 6 * 4 - 4     # hand-written LoRA
    assert exercises.check("11.trap_adapters", 20) is True
    assert exercises.check("11.trap_adapters", 24) is False
    assert exercises.check("11.trap_adapters", 16) is False
    assert exercises.check("11.trap_adapters", "twenty") is False


def test_every_second_share_is_over_half(capsys):
    # worked out independently: the GPT block (B 2, T 64, H 64, n_h 4) keeps its input (H per
    # token) beside the matmul outputs, 3H, n_h T = 4H, H, H, 4H, H per token; the 1st, 3rd and
    # 5th are 8H of the 14H: (8 + 1) / (14 + 1) = 0.6
    assert lesson11.every_second_share() == 9 / 15
    assert lesson11.every_second_choice() == "over half"
    assert exercises.check("11.every_second_share", "over half") is True
    assert exercises.check("11.every_second_share", "Over half") is True
    assert exercises.check("11.every_second_share", "about half") is False   # half the matmuls
    assert exercises.check("11.every_second_share", "under half") is False
    assert exercises.check("11.every_second_share", 0.6) is False
    out = capsys.readouterr().out
    assert "not half the bytes" in out and "Answer one of" in out


MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)


def _policy_fn(decide):
    """A context_fn from decide(count of matmuls so far) -> keep?, with a counter per call."""
    def context_fn():
        seen = [0]

        def policy(ctx, op, *args, **kwargs):
            if op.overloadpacket not in MATMULS:
                return CheckpointPolicy.PREFER_RECOMPUTE
            seen[0] += 1
            return CheckpointPolicy.MUST_SAVE if decide(seen[0]) else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context_fn


SHARED = [0]


def _shared_counter():
    """The counter outside context_fn: every checkpoint call after the first counts on."""
    def policy(ctx, op, *args, **kwargs):
        if op.overloadpacket not in MATMULS:
            return CheckpointPolicy.PREFER_RECOMPUTE
        SHARED[0] += 1
        return CheckpointPolicy.MUST_SAVE if SHARED[0] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def test_every_second_matmul_accepts_the_solution_and_diagnoses_wrong_ones(capsys):
    assert exercises.check("11.every_second_matmul", _policy_fn(lambda n: n % 2 == 1)) is True
    # worked out independently for one GPT block (B 2, T 64, H 64): its 6 matmuls in order
    # are qkv (3 B T H), scores (B n_h T T), weighted values (B T H), attention projection,
    # MLP up (4 B T H), MLP down; the 1st, 3rd and 5th outputs are 3 + 1 + 4 = 8 B T H floats,
    # and the checkpoint keeps its input, B T H, beside them
    from ckpt_lab.lessons import stack
    block, x = lesson11.gpt_block()
    ours = stack.measure("odd", lambda t: checkpoint(
        block, t, use_reentrant=False, context_fn=_policy_fn(lambda n: n % 2 == 1)), block, x)
    assert ours.kept_bytes == (8 + 1) * 2 * 64 * 64 * 4
    wrong = {
        "every matmul": _policy_fn(lambda n: True),
        "the even ones": _policy_fn(lambda n: n % 2 == 0),
        "a counter shared by every call": _shared_counter,
    }
    for name, context_fn in wrong.items():
        assert exercises.check("11.every_second_matmul", context_fn) is False, name
    assert exercises.check("11.every_second_matmul", lambda: None) is False       # unanswered
    assert exercises.check("11.every_second_matmul", 3) is False
    out = capsys.readouterr().out
    assert "too much" in out and "too little" in out and "an odd count" in out
    assert "not answered yet" in out and "Pass your function itself" in out


def test_predictions_record_then_reveal(capsys):
    guess = exercises.predict("11.trap_adapters", 20)
    assert "prediction recorded" in capsys.readouterr().out
    assert guess.reveal() is True
    assert exercises.predict("11.every_second_share", None).reveal() is False


def test_in_your_code_imports_and_policy_run_when_pasted():
    """Lesson 11's copyable block: its imports and its policy run in a fresh interpreter, and
    the policy keeps matmul outputs (the model lines need the learner's model)."""
    import subprocess
    import sys

    from exercise_checks import in_your_code
    code = in_your_code("11_checkpointing_in_your_stack")
    assert "use_reentrant" in code and "activation_checkpointing_enable" in code
    lines = code.splitlines()
    runnable = [line for line in lines if line.startswith(("import ", "from ", "MATMULS"))]
    start = next(i for i, line in enumerate(lines) if line.startswith("def policy"))
    runnable += lines[start:start + 3] + [
        "x = torch.randn(4, 8, requires_grad=True); w = torch.randn(8, 8, requires_grad=True)",
        "ctx = functools.partial(create_selective_checkpoint_contexts, policy)",
        "y = checkpoint(lambda t: (t @ w).relu() @ w, x, use_reentrant=False, context_fn=ctx)",
        "y.sum().backward(); assert x.grad is not None"]
    run = subprocess.run([sys.executable, "-c", "\n".join(runnable)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
