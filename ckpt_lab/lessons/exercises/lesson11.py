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
def core_freed_percent(attn_impl: str = "manual", batch: int = 2, seq: int = 64, hidden: int = 64,
                       heads: int = 4) -> float:
    """Measured: % of a GPT block's kept bytes that recomputing only its attention core frees,
    attention written out ("manual") or fused ("sdpa"), dropout 0, at the lesson's CPU sizes."""
    from ckpt_lab.lessons import stack
    from ckpt_lab.training.models import Block, GPTConfig
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=hidden, n_head=heads, block_size=seq, dropout=0.0,
                            attn_impl=attn_impl))
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    r = stack.attention_core_saving(block, x)
    plain = r["plain"].kept_bytes
    return 100 * (plain - r["attention core recomputed"].kept_bytes) / plain


def _manual_core(answer):
    value, expected = _number(answer), core_freed_percent("manual")
    sdpa = core_freed_percent("sdpa")
    if not 0 <= value <= 100:
        return False, "A percentage of what the block keeps: between 0 and 100."
    if abs(value - expected) <= 5:
        return True, (f"{expected:.0f}% measured: written out, the core keeps its T x T softmax "
                      "output (B x heads x T x T floats) and the causal mask, and recomputing it "
                      f"frees them, for FLOPs. With SDPA the same recompute frees {sdpa:.1f}%: the "
                      "fused kernel stores no scores, only one log-sum-exp per row.")
    if value > expected:
        return False, (f"Too much: {expected:.0f}% measured. With dropout 0 the core keeps no "
                       "dropout mask and no dropout output: one T x T softmax output (and the "
                       "causal mask), beside the block's many B x T x C and B x T x 4C tensors.")
    return False, (f"Too little: {expected:.0f}% measured. That is fused attention's answer "
                   f"({sdpa:.1f}% with SDPA); written out, the core stores its T x T softmax "
                   "output, which at 64 tokens is as large as the MLP's B x T x 4C tensors.")


EXERCISES = [
    Exercise("11.peak_drop", "A tiny Llama (6 layers, batch 2 x 64 tokens): Hugging Face's own "
             "switch checkpoints every layer. By what factor does the step's peak fall (plain "
             "peak / checkpointed peak)?", _peak_drop, peak_drop),
    Exercise("11.trap_adapters", "The same 6-layer Llama with LoRA (A and B) on q_proj and v_proj "
             "of every layer, everything else frozen, checkpointed with use_reentrant=True and "
             "every_n_layers=3, input grads NOT enabled: how many of the 24 adapter tensors get "
             "a gradient?", _trap_adapters, trap_adapters_with_grad),
    Exercise("11.manual_core", "One GPT block at this lesson's CPU sizes (batch 2, 64 tokens, "
             "width 64, 4 heads), attention written out (not fused), dropout 0: recomputing "
             "only its attention core frees what percentage of the bytes the block keeps for "
             "backward?", _manual_core, core_freed_percent),
]
