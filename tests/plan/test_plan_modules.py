"""plan_modules on the exact step model, against the measurement, on model families.

For the course's GPT, ``nn.TransformerEncoder`` (pre-norm with masks; post-norm on an input that
needs no grad) and two Hugging Face models built from a config (Llama, GPT-2): the predicted
step peak equals what `track_memory` measures for every set of checkpointed blocks; plans for
budgets of 0.5-0.9 of the plain step's peak measure what they predict and stay within the
budget; the dynamic programme finds what a brute-force search over every set finds.
"""
import itertools
import os

import pytest
import torch
from torch import nn

from ckpt_lab import checkpoint_modules, track_memory
from ckpt_lab.training.models import GPT, Block, GPTConfig
from ckpt_lab.plan.module_planner import plan_modules, profile_module_step
from ckpt_lab.plan.planner import BudgetTooSmallError

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32,
                          dropout=0.1))
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    tgt = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    return model, Block, lambda: model(idx, tgt)


def encoder(norm_first=True):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True,
                                       norm_first=norm_first)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    x = torch.randn(4, 12, 32, generator=torch.Generator().manual_seed(2))
    if not norm_first:   # post-norm, on an input that needs no grad
        return model, nn.TransformerEncoderLayer, lambda: model(x).sum()
    x.requires_grad_()
    causal = torch.ones(12, 12, dtype=torch.bool).triu(1)
    pad = torch.zeros(4, 12, dtype=torch.bool)
    pad[1, 9:] = True
    return model, nn.TransformerEncoderLayer, \
        lambda: model(x, mask=causal, src_key_padding_mask=pad).sum()


def hugging_face(kind):
    import transformers
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32,
            use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    else:
        config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=4, n_head=4,
                                         n_positions=32, use_cache=False, bos_token_id=0,
                                         eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).train()
    blocks = model.model.layers if kind == "llama" else model.transformer.h
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    return model, type(blocks[0]), lambda: model(input_ids=ids, labels=ids, use_cache=False)


FAMILIES = {"course GPT": gpt, "encoder, pre-norm, masks": encoder,
            "encoder, post-norm, input without grad": lambda: encoder(False),
            "HF Llama": lambda: hugging_face("llama"), "HF GPT-2": lambda: hugging_face("gpt2")}


def measured_peak(model, step, names, seed=5):
    """One step as an engineer measures it: gradients None, the loss's backward."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with checkpoint_modules(model, list(names)):
        with track_memory() as mem:
            out = step()
            loss = out if isinstance(out, torch.Tensor) else out.loss
            del out
            loss.backward()
            del loss
    model.zero_grad(set_to_none=True)
    return mem.peak_bytes


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_set_of_blocks_measures_its_prediction_and_plans_fit(family):
    model, cls, step = FAMILIES[family]()
    model.zero_grad(set_to_none=True)
    ms = profile_module_step(model, cls, step)
    assert len(ms.names) == 4
    sets = [s for r in range(5) for s in itertools.combinations(ms.names, r)]
    predicted = {s: ms.peak_bytes(s) for s in sets}
    for s in sets:
        assert measured_peak(model, step, s) == predicted[s], s
    plain = predicted[()]
    assert ms.plain_peak_bytes == plain
    # the plans of an engineer: a fraction of the plain step's measured peak
    least = min(predicted.values())
    for fraction in (0.5, 0.6, 0.7, 0.8, 0.9):
        budget = int(fraction * plain)
        if budget < least:
            with pytest.raises(BudgetTooSmallError) as err:
                plan_modules(model, cls, step, budget)
            assert err.value.minimum_bytes == least and f"{least:,}" in str(err.value)
            continue
        plan = ms.plan(budget)
        assert plan.peak_bytes <= budget
        assert measured_peak(model, step, plan.select) == plan.peak_bytes, (fraction, plan)
    # the programme against every set: least recompute, then least peak
    cost = dict(zip(ms.names, ms.seconds))
    for budget in sorted(set(predicted.values())) + [least - 1]:
        fits = [(sum(cost[n] for n in s), predicted[s]) for s in sets if predicted[s] <= budget]
        if not fits:
            with pytest.raises(BudgetTooSmallError):
                ms.plan(budget)
            continue
        plan = ms.plan(budget)
        assert (plan.recompute_seconds, plan.peak_bytes) == pytest.approx(min(fits)), budget
    assert ms.minimum_bytes() == least


def test_a_plan_that_checkpoints_nothing_applies_as_a_no_op():
    model, cls, step = gpt()
    model.zero_grad(set_to_none=True)
    plan = plan_modules(model, cls, step, 10**9)
    assert plan.names == [] and plan.select == [] and plan.recompute_seconds == 0
    with checkpoint_modules(model, plan.select) as handle:
        assert handle.names == [] and all("forward" not in vars(m) for m in model.modules())
        assert measured_peak(model, step, []) == plan.peak_bytes == plan.step.plain_peak_bytes
    handle.remove()
    with pytest.raises(ValueError, match="not the name of a submodule"):
        checkpoint_modules(model, ["chain.1", "chain.9"])
    with pytest.raises(TypeError, match="module names"):
        checkpoint_modules(model, [Block])


def test_planned_gradients_are_bitwise_those_of_the_plain_step_and_the_model_is_left_alone():
    model, cls, step = gpt()
    budget = int(0.7 * measured_peak(model, step, []))
    for p in model.parameters():
        p.grad = torch.full_like(p, 3.0)
    grads = [p.grad for p in model.parameters()]
    torch.manual_seed(11)
    plan = plan_modules(model, cls, step, budget)
    after = torch.rand(2)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(2))             # the generator did not move
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert all(bool((g == 3).all()) for g in grads)
    assert 0 < len(plan.names) < 4

    def run():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        step().backward()
        return [p.grad for p in model.parameters()]

    plain = run()
    with checkpoint_modules(model, plan.select):
        ours = run()
    assert all(torch.equal(a, b) for a, b in zip(plain, ours))


def test_a_step_plan_modules_cannot_read_says_what_to_do():
    model, cls, step = gpt()
    with pytest.raises(ValueError, match="no gradient reached"):   # a forward alone
        profile_module_step(model, cls, lambda: step() and None)
    x = torch.randn(2, 12, 32)
    enc, layer, _ = encoder(False)
    with pytest.raises(ValueError, match="not a scalar loss"):
        profile_module_step(enc, layer, lambda: enc(x.requires_grad_()))
