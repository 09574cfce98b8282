"""docs/decision_guide.md states what the lessons measured: every figure equals its formula or
the committed GPU run it links to (as in docs/recipes.md), and the rows the lessons contradicted
say what was measured, with its condition."""
import re
from pathlib import Path

import pytest

from test_recipes import FIGURE, _shown, _value

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docs" / "decision_guide.md").read_text()
FIGURES = FIGURE.findall(TEXT)
ROWS = [line for line in TEXT.splitlines() if line.startswith("| ") and not line.startswith("| situation")]


def _row(situation: str) -> str:
    """The table row whose first cell starts with `situation`."""
    return next(r for r in ROWS if r.split("|")[1].strip().startswith(situation))


def test_the_page_has_figures_from_formulas_and_the_gpu_run():
    assert {target.rsplit(".", 1)[-1] for _, target, _ in FIGURES} == {"json", "py"}


@pytest.mark.parametrize("text, target, title", FIGURES, ids=[f[0] for f in FIGURES])
def test_every_figure_is_its_formula_or_its_json(text, target, title):
    shown, digits = _shown(text)
    value = _value(target, title)
    if digits is None:
        assert abs(value - shown) < 1e-9, (text, value)
    else:
        assert round(value, digits) == shown, (text, value)


def test_the_compile_row_says_a_lower_budget_can_peak_higher():
    row = _row("the model runs under `torch.compile`")
    assert "use_reentrant=False" in row and "measure each peak" in row
    assert "can peak higher" in row and "budget 0.1 peaked above 0.5" in row
    assert "barely moves" not in row                      # no step time was measured with fusion


def test_the_price_of_a_hugging_face_switch_has_both_bases():
    row = _row("a Hugging Face model")
    assert "with dropout" in row and "without it" in row and "early stop" in row
    assert "+1/3" not in row


def test_the_early_stop_price_names_the_mlp_it_holds_for():
    """+22% holds for a GPT-style 4h MLP (the down projection a third of the block's matmuls);
    a SwiGLU MLP's down projection is 2/9 of them, so +26%. The fractions themselves are
    measured in tests/lessons/test_recipes.py (test_early_stop_without_dropout_skips_*)."""
    row = _row("a Hugging Face model")
    early, swiglu = "(10**9, 10**6, 2 / 3)", "(10**9, 10**6, 7 / 9)"
    assert early in row and swiglu in row and "most LLMs" not in row
    gpt, llama = row.split(swiglu)[0].rsplit("[+22%]", 1)[1], row.split(swiglu)[1]
    assert "GPT-style `4h` MLP" in gpt and "a third" in gpt
    assert "SwiGLU" in llama and "2/9" in llama and "lesson 11" in llama


def test_sqrt_l_comes_with_its_condition():
    row = _row("a chain of layers")
    assert "keeps about what it passes on" in row and "transformer blocks" in row


def test_sqrt_l_segments_recompute_all_but_the_last_segment():
    """checkpoint_sequential does not re-run its last segment: 1 - 1/sqrt(L) of a forward, as
    recipes.md and lesson 8 say, not one whole forward."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint_sequential
    row = _row("a chain of layers")
    assert "one more forward of every segment but the last" in row and "1 - 1/sqrt(L)" in row
    runs = []
    layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(16)])
    for layer in layers:
        layer.register_forward_hook(lambda m, a, o: runs.append(m))
    x = torch.randn(2, 4, requires_grad=True)
    # early stop off: with it, each segment's recompute may also skip a tail its backward
    # does not need (here each segment's last Linear), never more
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        checkpoint_sequential(layers, 4, x, use_reentrant=False).sum().backward()
    assert len(runs) - 16 == 12                            # 3/4 of the 16 layers again


def test_saving_matmuls_is_free_of_matmuls_not_of_time():
    row = _row("attention written out")
    assert "no extra FLOPs" not in row and "re-runs no matmul" in row and "cost time" in row


def test_micro_batch_one_row_claims_no_halving_from_autocast():
    row = _row("still short with every block checkpointed and micro-batch 1")
    assert "does not halve" in row and "only a model cast to bf16 halves" in row
    assert "gradient accumulation" not in row and "cannot go below micro-batch 1" in row
    assert "gradient accumulation" in _row("micro-batch above 1")
    assert not re.search(r"bf16 halves activation", TEXT)


def test_the_lora_trap_states_its_condition():
    trap = " ".join(TEXT.split("**LoRA")[1].split("\n- ")[0].split())
    assert "with input grads off" in trap and "transformers 5" in trap


def test_the_glossary_says_what_flop_counter_mode_counts():
    """FlopCounterMode's registry holds matmuls, convolutions and attention kernels only, and
    counts nothing for pointwise ops, norms and softmax: the glossary's FLOPs entry says so."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    names = {str(op).rsplit(".", 1)[-1] for op in FlopCounterMode(display=False).flop_registry}
    assert all(re.search(r"mm|conv|attention", n) for n in names), names
    x = torch.randn(8, 16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.layer_norm(torch.nn.functional.gelu(x).softmax(-1), (16,)).sum().backward()
    assert counter.get_total_flops() == 0
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    entry = " ".join(glossary.split("### FLOPs")[1].split("\n#")[0].split())
    assert "only for matrix multiplies, convolutions and attention kernels" in entry
    assert "pointwise ops, norms and softmax cost time but no counted FLOPs" in entry


STACKS = {"Hugging Face": "transformers", "PyTorch FSDP2": "torch", "Accelerate": "accelerate",
          "PyTorch Lightning": "lightning", "PEFT": "peft", "DeepSpeed": "deepspeed",
          "Megatron-LM": "megatron-core", "torchtune": "torchtune"}
UNTESTED = {"DeepSpeed", "Megatron-LM", "torchtune"}


def test_every_stack_has_its_switch_version_and_status():
    """One row per stack, the version the recipe card states (for a stack tested here, the
    one requirements.txt pins), "untested here" exactly where the card says so."""
    recipes = (ROOT / "docs" / "recipes.md").read_text()
    pins = dict(l.split("==") for l in (ROOT / "requirements.txt").read_text().splitlines()
                if l.strip() and not l.startswith("#"))
    for stack, dist in STACKS.items():
        cells = [c.strip() for c in _row(stack).split("|")[1:-1]]
        assert len(cells) == 5 and all(cells), stack
        version = re.fullmatch(rf"`{dist}==([\d.]+)`", cells[2]).group(1)
        assert f"`{dist}=={version}`" in recipes, stack
        if stack in UNTESTED:
            assert cells[3] == "untested here", stack
        else:
            assert cells[3].startswith(("tested here", "FSDP2 route tested here")), stack
            assert version == pins[dist], stack
    switches = " ".join(_row(s) for s in STACKS)
    for name in ("FullyShardedDataParallelPlugin", "activation_checkpointing=True",
                 "fsdp_activation_checkpointing", "activation_checkpointing_policy",
                 "ModelParallelStrategy", "partition_activations", "cpu_checkpointing",
                 "deepspeed.checkpointing.checkpoint", "--recompute-granularity selective",
                 "`full`", "--recompute-method uniform", "`block`", "--recompute-num-layers",
                 "enable_activation_checkpointing", "enable_activation_offloading"):
        assert name in switches, name


def test_the_accelerate_row_names_the_dropout_defect_the_tests_measure():
    row = _row("Accelerate")
    assert "does not replay the random state" in row
    assert "with dropout the gradients are wrong" in row
    assert "test_accelerate_fsdp2_switch_does_not_replay_dropout" in \
        (ROOT / "tests" / "lessons" / "test_recipes_stacks.py").read_text()
