"""Exercises of lesson 11: which switch checkpoints the model in your stack.

Three committed predictions, each measured the way the lesson measures it, at the lesson's CPU
sizes (the Hugging Face models are the same on every device; the attention block is lesson
11's CPU-size block).
"""
from __future__ import annotations

import functools
import math
import warnings

import torch

from .base import Exercise, _number, near

LAYERS, BATCH, SEQ, VOCAB = 6, 2, 64, 256      # the lesson's tiny Hugging Face models


def _quiet_transformers():
    import transformers
    transformers.logging.set_verbosity_error()


@functools.lru_cache(maxsize=None)
def peak_drop() -> float:
    """Measured: plain step peak / peak with Hugging Face's own switch, tiny Llama, CPU."""
    from ckpt_lab.lessons import hf
    _quiet_transformers()
    model = hf.tiny_model("llama", layers=LAYERS)
    ids = hf.token_batch(BATCH, SEQ, VOCAB)
    plain = hf.train_step(model, ids)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    checkpointed = hf.train_step(model, ids)
    return plain.peak_bytes / checkpointed.peak_bytes


def _peak_drop(answer):
    value, expected = _number(answer), peak_drop()
    if value <= 0:
        return False, "Give a factor above 0: the plain peak divided by the checkpointed one."
    if abs(math.log(value / expected)) <= math.log(1.25):
        return True, (f"x{expected:.2f} measured. The kept bytes fell far more; the peak is set "
                      "in the backward, where every gradient and one recomputed layer live.")
    if value > expected:
        return False, (f"Too high: x{expected:.2f} measured. The kept bytes fell about that much, "
                       "but the peak comes in the backward: the gradients of every weight, the "
                       "logits' gradient and one recomputed layer are alive there at once.")
    return False, (f"Too low: x{expected:.2f} measured. In the plain step most of the peak is the "
                   "activations the forward keeps; checkpointing removes all but each layer's "
                   "input, so the peak does fall.")


@functools.lru_cache(maxsize=None)
def trap_adapters_with_grad(layers: int = LAYERS, every: int = 3) -> int:
    """Measured: adapter tensors that get a gradient when a tiny Llama with LoRA on q_proj and
    v_proj (everything else frozen) is checkpointed reentrantly on every `every`-th layer,
    without enable_input_require_grads."""
    from ckpt_lab.lessons import hf
    _quiet_transformers()
    model = hf.tiny_model("llama", layers=layers)
    hf.add_lora(model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True},
                                          every_n_layers=every)
    model.disable_input_require_grads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.train_step(model, hf.token_batch(BATCH, SEQ, VOCAB))
    return hf.trainable_with_grad(model)


_trap_adapters = near(
    trap_adapters_with_grad, 0,
    right="{expected} of 24: layer 0's input is the frozen embedding's output, so its four "
          "adapter tensors get nothing; layer 3's input comes from layers with trainable "
          "adapters, so it is fine. Only a UserWarning says so.",
    low="Too few: a reentrant checkpoint loses gradients only when none of its inputs requires "
        "grad. Which checkpointed layer gets an input computed by trainable adapters in an "
        "earlier layer?",
    high="Too many: layer 0 is checkpointed and its input, the frozen embedding's output, does "
         "not require grad: its adapters (A and B of q_proj and v_proj) get nothing, and the step "
         "runs on without an error.")


@functools.lru_cache(maxsize=None)
def sdpa_core_freed_percent(batch: int = 2, seq: int = 64, hidden: int = 64,
                            heads: int = 4) -> float:
    """Measured: % of a GPT block's kept bytes that recomputing only its attention core frees
    with SDPA (dropout 0), at the lesson's CPU sizes."""
    from ckpt_lab.lessons import stack
    from ckpt_lab.models import Block, GPTConfig
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=hidden, n_head=heads, block_size=seq, dropout=0.0,
                            attn_impl="sdpa"))
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    r = stack.attention_core_saving(block, x)
    plain = r["plain"].kept_bytes
    return 100 * (plain - r["attention core recomputed"].kept_bytes) / plain


def _sdpa_core(answer):
    value, expected = _number(answer), sdpa_core_freed_percent()
    if 0 <= value < 2:
        return True, (f"{expected:.1f}% measured: the fused kernel stores no T x T scores, only one "
                      "log-sum-exp per row, so the recompute frees almost nothing and still costs "
                      "FLOPs. Checkpoint whole blocks instead.")
    if value < 0:
        return False, "A percentage of what the block keeps: between 0 and 100."
    return False, (f"Too much: {expected:.1f}% measured. That is the written-out core's bargain, "
                   "where the T x T scores, softmax and dropout mask are stored; SDPA never "
                   "stores them, so recomputing its core has almost nothing to free.")


EXERCISES = [
    Exercise("11.peak_drop", "A tiny Llama (6 layers, batch 2 x 64 tokens): Hugging Face's own "
             "switch checkpoints every layer. By what factor does the step's peak fall (plain "
             "peak / checkpointed peak)?", _peak_drop, peak_drop),
    Exercise("11.trap_adapters", "The same 6-layer Llama with LoRA (A and B) on q_proj and v_proj "
             "of every layer, everything else frozen, checkpointed with use_reentrant=True and "
             "every_n_layers=3, input grads NOT enabled: how many of the 24 adapter tensors get "
             "a gradient?", _trap_adapters, trap_adapters_with_grad),
    Exercise("11.sdpa_core", "One GPT block with fused attention (SDPA): recomputing only its "
             "attention core frees what percentage of the bytes the block keeps for backward?",
             _sdpa_core, sdpa_core_freed_percent),
]
