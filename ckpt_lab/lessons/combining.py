"""Lesson 7's meters for one training step of the course's GPT: the step peak (activations),
the FLOPs, and the step peak the formulas predict under the model's checkpoint policy.

The lesson writes the step itself (accumulation, autocast, offload) where a learner reads it;
these functions measure whichever step they are handed, or price one from lesson 5's terms.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.lessons.saved import CORE_TERMS
from ckpt_lab.measure.memory import track_memory
from ckpt_lab.plan import formulas


def step_peak(model, step: Callable[[], object]) -> int:
    """Step peak (activations) of ``step()``: the parameter gradients, model state, are
    allocated (as zeros) before the tracker starts."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        step()
    return mem.peak_bytes


def step_flops(step: Callable[[], object]) -> int:
    """FLOPs of ``step()``, counted by PyTorch's FlopCounterMode (matmuls; exact)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def predicted_peak(model, batch: int, dtype_bytes: int = 4) -> int:
    """The formulas' step peak (activations) of ``model`` (a `models.GPT`) at a micro-batch of
    ``batch`` rows, under its policy: `formulas.chain_peak_bytes` over `formulas.gpt_layers`
    (lesson 5's terms); selective recomputation drops the attention core's terms of every
    block."""
    c = model.config
    dropout = c.dropout > 0
    layers = formulas.gpt_layers(batch, c.block_size, c.n_layer, c.n_embd, c.n_head,
                                 c.vocab_size, dtype_bytes, dropout)
    peak = formulas.chain_peak_bytes(layers, model.segments(), batch * c.block_size,
                                     c.vocab_size, dtype_bytes)
    if model.policy.kind == "selective":
        terms = formulas.gpt_block_terms(batch, c.block_size, c.n_embd, c.n_head, dtype_bytes,
                                         dropout)
        peak -= c.n_layer * sum(terms[t] for t in CORE_TERMS)
    return peak


def nbytes(tensors) -> int:
    """Bytes of the given tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)
