"""Exercises of lesson 8: Capacity planning and out-of-memory fallback."""
from __future__ import annotations

import torch

from ckpt_lab.memory import kept_after_forward

from .base import GIB, Exercise, _close, _number

FUSED_BLOCK = dict(batch=8, seq=64, n_embd=128, n_head=4)


def fused_block_saved_bytes() -> int:
    """Measured bytes one `models.Block` with attn_impl="sdpa" keeps for backward (fp32, no
    dropout, FUSED_BLOCK's sizes), its input included: what exercise 08.1 predicts."""
    from ckpt_lab.models import GPTConfig, build_model
    b, t, c, h = (FUSED_BLOCK[k] for k in ("batch", "seq", "n_embd", "n_head"))
    model = build_model(GPTConfig(block_size=t, n_layer=1, n_head=h, n_embd=c, dropout=0.0,
                                  attn_impl="sdpa"))
    x = torch.randn(b, t, c, requires_grad=True)
    # allocated and alive after forward: everything saved but the input, plus the output,
    # which is as large as the input, so this is what the block keeps, its input included
    return kept_after_forward(model.blocks()[0], x)


def _fused_block(answer):
    expected = fused_block_saved_bytes()
    return _close(answer, expected, 0.02,
                  "Too few: count the block's input (kept by the first LayerNorm), the qkv "
                  "input, Q, K and V (the fused kernel keeps them), the output projection's "
                  "input, the second LayerNorm's input, the MLP's input and its two 4C-wide "
                  "tensors (GELU's input and output), all in fp32.",
                  "Too many: a fused kernel keeps no T x T scores (no softmax output, no "
                  "masks), and its output is the output projection's input, one tensor.")


def _usable_gib(answer):
    from ckpt_lab.capacity import DEFAULT_HEADROOM, parse_bytes
    expected = DEFAULT_HEADROOM * parse_bytes("80GB") / GIB
    return _close(answer, expected, 0.01,
                  "Too few: 80 GB is 80e9 bytes (a GB is 10**9); take 85% of it, then divide "
                  "by 2**30.",
                  "Too many: a GB is 10**9 bytes, a GiB 2**30: 80 GB is about 74.5 GiB before "
                  "the 85% rule.")


def fallback_rungs(order, fits_micro_batch: int = 2, batch_size: int = 8,
                   max_every: int = 4) -> int:
    """Rungs `run_with_fallback` tries when a step fits only at micro-batch <= fits_micro_batch."""
    from ckpt_lab.fallback import StepConfig, run_with_fallback

    def step(config):
        if config.micro_batch > fits_micro_batch:
            raise torch.OutOfMemoryError(f"micro-batch {config.micro_batch} does not fit")
        return config
    import logging
    logger = logging.getLogger("ckpt_lab.fallback")
    level = logger.level
    logger.setLevel(logging.ERROR)      # the ladder's warnings would drown the check's answer
    try:
        return len(run_with_fallback(step, StepConfig(0, 1, batch_size), order=order,
                                     max_every=max_every).rungs)
    finally:
        logger.setLevel(level)


def _fallback_rungs(answer):
    expected = fallback_rungs(("densify", "accumulate", "shrink"))
    value = _number(answer)
    if value == expected:
        return True, (f"{expected} rungs: densifying (off, every 4, 2, 1) cannot help a step "
                      "that only fits at micro-batch 2, so all four fail before accumulation.")
    return False, ("Walk the ladder: densify until every block is checkpointed (each fails), "
                   "then double accumulation until micro-batch 2; count the configurations, "
                   "the one that fits included.")


EXERCISES = [
    Exercise("08.fused_block_bytes", "The course's GPT block with fused attention "
             "(attn_impl='sdpa'): batch 8, T 64, C 128, 4 heads, fp32, dropout off. Predict the "
             "bytes it keeps for backward, its input included and its output not, with "
             "formulas.transformer_layer_terms or by hand; the next cell measures it.",
             _fused_block),
    Exercise("08.usable_gib", "An '80 GB' GPU and the keep-peak-under-85% rule: how many GiB may "
             "the planned peak use?", _usable_gib),
    Exercise("08.fallback_rungs", "Article order (densify, accumulate, shrink), start with no "
             "checkpointing, accumulation 1, batch 8, max_every=4; the step fits only at "
             "micro-batch <= 2: how many configurations does run_with_fallback try?",
             _fallback_rungs),
]
