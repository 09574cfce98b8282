"""checkpoint_modules on Hugging Face models (built from configs, nothing downloaded) against
plain autograd and the model's own switch; the cache and the reentrant trap, measured."""
import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from ckpt_lab import checkpoint_modules, hf  # noqa: E402
from ckpt_lab.modules import profile_modules  # noqa: E402

IDS = hf.token_batch(2, 64, 256)


@pytest.fixture(autouse=True)
def _quiet(one_thread):
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield
    transformers.logging.set_verbosity(verbosity)


@pytest.mark.parametrize("kind", hf.KINDS)
def test_checkpoint_modules_matches_plain_and_the_models_own_switch(kind):
    model = hf.tiny_model(kind)
    keys = list(model.state_dict())
    plain = hf.train_step(model, IDS)
    name = hf.enable_checkpointing(model, use_reentrant=False)
    assert name in ("activation_checkpointing_enable", "gradient_checkpointing_enable")
    own = hf.train_step(model, IDS)
    hf.disable_checkpointing(model)
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


def test_every_nth_layer_switch_equals_a_predicate_and_the_profile_predicts_it():
    model = hf.tiny_model("llama")
    plain = hf.train_step(model, IDS)
    prof = profile_modules(model, hf.block_class(model),
                           lambda: model(input_ids=IDS, labels=IDS, use_cache=False))
    hf.enable_checkpointing(model, every_n_layers=2)
    own = hf.train_step(model, IDS)
    hf.disable_checkpointing(model)
    cls = hf.block_class(model)
    every_2nd = lambda n, m: isinstance(m, cls) and int(n.rsplit(".", 1)[1]) % 2 == 0  # noqa: E731
    with checkpoint_modules(model, every_2nd) as handle:
        ours = hf.train_step(model, IDS)
    assert handle.names == ["model.layers.0", "model.layers.2"]
    assert hf.same_grads(plain, own) and hf.same_grads(plain, ours)
    assert ours.kept_bytes == own.kept_bytes
    assert plain.kept_bytes - ours.kept_bytes == prof.checkpoint_saving_bytes(handle.names)
    assert prof.shared_args_bytes == 64 * 8     # position_ids, (1, T) int64, kept as an input


@pytest.mark.parametrize("kind", hf.KINDS)
def test_the_cache_pins_keys_and_values_and_the_recompute_writes_it_again(kind):
    model = hf.tiny_model(kind)
    c = hf.measure_cache(model, IDS)
    assert c.checkpointed_on - c.checkpointed_off == hf.kv_cache_bytes(model.config, 2, 64)
    assert c.plain_on - c.plain_off < hf.kv_cache_bytes(model.config, 2, 64)
    assert (c.tokens_after_forward, c.tokens_after_backward) == (64, 128)
    with checkpoint_modules(model, hf.block_class(model)):
        with pytest.raises(ValueError, match="use_cache=False"):
            model(input_ids=IDS, labels=IDS, use_cache=True)
        with torch.no_grad():                          # generation is unaffected
            model(input_ids=IDS, use_cache=True)


def test_reentrant_trap_with_frozen_inputs():
    model = hf.tiny_model("llama")
    trainable = hf.add_lora(model)
    assert len(trainable) == 4 * model.config.num_hidden_layers      # A and B, q and v
    results = {r.setting: r for r in hf.reentrant_trap(model, IDS)}
    assert "does not require grad" in results["reentrant, every layer"].error
    half = results["reentrant, every 2nd layer"]
    assert half.error is None and half.adapters_with_grad == half.adapters - 4   # layer 0's
    assert not half.same_as_plain
    for ok in ("reentrant + enable_input_require_grads", "non-reentrant (use_reentrant=False)",
               "checkpoint_modules, impl='hooks'"):
        assert results[ok].same_as_plain and results[ok].adapters_with_grad == 16, ok
    # ckpt_lab's reentrant node takes the parameters its forward read as inputs: no trap
    ours = results["checkpoint_modules, impl='reentrant'"]
    assert ours.error is None and ours.same_as_plain and ours.adapters_with_grad == 16
    # making the embedding output require grad costs its gradient: B x T x hidden floats
    extra = (results["reentrant + enable_input_require_grads"].peak_bytes
             - results["non-reentrant (use_reentrant=False)"].peak_bytes)
    assert extra == hf.block_input_bytes(model, 2, 64)


def test_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        hf.tiny_model("bert")


def test_lesson_11_exercises_right_wrong_and_unanswered(capsys):
    from ckpt_lab import exercises
    assert exercises.keys(11) == ["11.kv_cache_mib", "11.trap_adapters", "11.compiled_kept_mib"]
    # worked out independently: 2 (K, V) x 8 layers x 4 x 1024 tokens x 2 KV heads x 64 x 2 bytes
    right_wrong = {"11.kv_cache_mib": (2 * 8 * 4 * 1024 * 2 * 64 * 2 / 2 ** 20, 64),
                   "11.trap_adapters": (24 - 4, 24),
                   "11.compiled_kept_mib": (2 * 8 * 512 * 256 * 4 / 2 ** 20, 4)}
    for key, (right, wrong) in right_wrong.items():
        assert exercises.check(key, right) is True
        assert exercises.check(key, wrong) is False
        assert exercises.check(key, None) is False
        assert exercises.check(key, "many") is False
    out = capsys.readouterr().out
    assert out.count("✓") == 3 and out.count("not answered yet") == 3
