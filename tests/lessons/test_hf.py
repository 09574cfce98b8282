"""Hugging Face models (built from configs, nothing downloaded): their own checkpointing switch
against plain autograd and `checkpoint_modules`, a plan over their layers, the cache and the
reentrant trap, measured."""
import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from ckpt_lab import checkpoint_modules  # noqa: E402
from ckpt_lab.lessons import hf  # noqa: E402
from ckpt_lab.plan.module_planner import plan_modules, profile_modules  # noqa: E402

IDS = hf.token_batch(2, 64, 256)
NO_REENTRANT = {"use_reentrant": False}


@pytest.fixture(autouse=True)
def _quiet(one_thread):
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield
    transformers.logging.set_verbosity(verbosity)


def _step(model):
    return lambda: model(input_ids=IDS, labels=IDS, use_cache=False)


@pytest.mark.parametrize("kind", hf.KINDS)
def test_checkpoint_modules_matches_plain_and_the_models_own_switch(kind):
    model = hf.tiny_model(kind)
    keys = list(model.state_dict())
    plain = hf.train_step(model, IDS)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=NO_REENTRANT)
    own = hf.train_step(model, IDS)
    model.activation_checkpointing_disable()
    handle = checkpoint_modules(model, hf.block_class(model))
    assert len(handle.names) == model.config.num_hidden_layers
    ours = hf.train_step(model, IDS)
    handle.remove()
    again = hf.train_step(model, IDS)
    assert hf.same_grads(plain, own) and hf.same_grads(plain, ours)
    assert ours.peak_bytes <= own.peak_bytes * 1.01
    assert ours.kept_bytes < plain.kept_bytes / 4
    assert list(model.state_dict()) == keys
    assert hf.same_grads(plain, again) and again.kept_bytes == plain.kept_bytes


def test_grads_allocated_takes_the_gradients_out_of_the_step_peak():
    """The two step peaks of the notation: gradients made in the backward (activations +
    gradients) or allocated before the step as model state (activations)."""
    model = hf.tiny_model("llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=NO_REENTRANT)
    made = hf.train_step(model, IDS)
    allocated = hf.train_step(model, IDS, grads_allocated=True)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    assert hf.same_grads(made, allocated) and made.kept_bytes == allocated.kept_bytes
    assert made.peak_bytes > made.kept_bytes + grads        # every gradient is in this one
    assert allocated.peak_bytes < made.peak_bytes - grads / 2


def test_the_deprecated_name_still_turns_the_same_switch():
    """transformers 5 renamed gradient_checkpointing_enable; the old name warns and does the same."""
    model = hf.tiny_model("llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=NO_REENTRANT)
    new = hf.train_step(model, IDS)
    model.activation_checkpointing_disable()
    with pytest.warns(FutureWarning, match="activation_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=NO_REENTRANT)
    old = hf.train_step(model, IDS)
    assert hf.same_grads(new, old) and new.kept_bytes == old.kept_bytes


def test_every_nth_layer_switch_equals_a_predicate_and_the_profile_predicts_it():
    model = hf.tiny_model("llama")
    plain = hf.train_step(model, IDS)
    prof = profile_modules(model, hf.block_class(model), _step(model))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=NO_REENTRANT,
                                          every_n_layers=2)
    own = hf.train_step(model, IDS)
    model.activation_checkpointing_disable()
    cls = hf.block_class(model)
    every_2nd = lambda n, m: isinstance(m, cls) and int(n.rsplit(".", 1)[1]) % 2 == 0  # noqa: E731
    with checkpoint_modules(model, every_2nd) as handle:
        ours = hf.train_step(model, IDS)
    assert handle.names == ["model.layers.0", "model.layers.2"]
    assert hf.same_grads(plain, own) and hf.same_grads(plain, ours)
    assert ours.kept_bytes == own.kept_bytes
    assert plain.kept_bytes - ours.kept_bytes == prof.checkpoint_saving_bytes(handle.names)
    assert prof.shared_args_bytes == 64 * 8     # position_ids, (1, T) int64, kept as an input


def test_a_plan_over_the_layers_peaks_where_it_predicts_and_frees_what_the_profile_predicts():
    model = hf.tiny_model("gpt2")
    plain = hf.train_step(model, IDS)
    prof = profile_modules(model, hf.block_class(model), _step(model))
    model.zero_grad(set_to_none=True)             # as train_step starts: the step allocates gradients
    budget = int(0.7 * plain.peak_bytes)          # a budget is the step's peak (tensor bytes)
    plan = plan_modules(model, hf.block_class(model), _step(model), budget)
    assert plan.peak_bytes <= budget and 0 < len(plan.names) < len(prof.blocks)
    with checkpoint_modules(model, plan.select):
        planned = hf.train_step(model, IDS)
    assert planned.peak_bytes == plan.peak_bytes <= budget
    assert plain.kept_bytes - planned.kept_bytes == prof.checkpoint_saving_bytes(plan.names)
    assert hf.same_grads(plain, planned)                # GPT-2's dropout included


@pytest.mark.parametrize("kind", hf.KINDS)
def test_the_cache_pins_keys_and_values_and_the_recompute_writes_it_again(kind):
    model = hf.tiny_model(kind)
    c = hf.measure_cache(model, IDS)
    assert c.checkpointed_on - c.checkpointed_off == hf.kv_cache_bytes(model.config, 2, 64)
    assert c.plain_on - c.plain_off < hf.kv_cache_bytes(model.config, 2, 64)
    assert (c.tokens_after_forward, c.tokens_after_backward) == (64, 128)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=NO_REENTRANT)
    assert model(input_ids=IDS, labels=IDS, use_cache=True).past_key_values is None
    model.activation_checkpointing_disable()
    with checkpoint_modules(model, hf.block_class(model)):
        with pytest.raises(ValueError, match="use_cache=False"):
            model(input_ids=IDS, labels=IDS, use_cache=True)
        with torch.no_grad():                          # generation is unaffected
            model(input_ids=IDS, use_cache=True)


def _lora_step(model, reference):
    """Adapters with a gradient, whether all gradients equal the reference's, the error."""
    try:
        step = hf.train_step(model, IDS)
    except (RuntimeError, ValueError) as err:
        return 0, False, str(err)
    return hf.trainable_with_grad(model), hf.same_grads(reference, step), ""


def test_reentrant_trap_with_frozen_inputs():
    model = hf.tiny_model("llama")
    trainable = hf.add_lora(model)
    assert len(trainable) == 4 * model.config.num_hidden_layers      # A and B, q and v
    adapters = len(trainable)
    reference = hf.train_step(model, IDS)

    def switch(reentrant, every=1, input_grads=False):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": reentrant}, every_n_layers=every)
        if not input_grads:                  # transformers 5 turns it on; the trap is without it
            model.disable_input_require_grads()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _lora_step(model, reference)
        model.activation_checkpointing_disable()
        model.disable_input_require_grads()
        return out

    assert "does not require grad" in switch(True)[2]
    assert switch(True, every=2) == (adapters - 4, False, "")        # layer 0's, silently
    assert switch(True, input_grads=True) == (adapters, True, "")
    assert switch(False) == (adapters, True, "")
    # ckpt_lab's reentrant node takes the parameters its forward read as inputs: no trap
    with checkpoint_modules(model, hf.block_class(model), impl="reentrant"):
        assert _lora_step(model, reference) == (adapters, True, "")
    with checkpoint_modules(model, hf.block_class(model)):
        assert _lora_step(model, reference) == (adapters, True, "")


def test_making_the_embedding_output_require_grad_costs_its_gradient():
    model = hf.tiny_model("llama")
    hf.add_lora(model)
    peaks = {}
    for reentrant in (True, False):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": reentrant})
        if not reentrant:
            model.disable_input_require_grads()
        peaks[reentrant] = hf.train_step(model, IDS).peak_bytes
        model.activation_checkpointing_disable()
        model.disable_input_require_grads()
    # the embedding output's gradient: B x T x hidden floats
    assert peaks[True] - peaks[False] == 2 * 64 * model.config.hidden_size * 4


def test_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        hf.tiny_model("bert")
