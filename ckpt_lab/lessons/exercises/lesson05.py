"""Predictions of lesson 5 (which activations grow with the sequence, and selective
recomputation). Each right answer is measured when it is needed, with `track_memory` on the
lesson's CPU-sized block and GPT."""
from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab.measure.memory import kept_after_forward, track_memory
from ckpt_lab.training.models import Block, GPTConfig, build_model

from .base import Exercise, near

# The lesson's CPU sizes (course.sizes picks them on a CPU).
SEQ, BATCH, HIDDEN, HEADS, LAYERS = 64, 4, 128, 4, 4


class CheckpointedCore(nn.Module):
    """An attention core run under torch's checkpoint: selective recomputation."""

    def __init__(self, core: nn.Module):
        super().__init__()
        self.core = core

    def forward(self, q, k, v):
        return torch.utils.checkpoint.checkpoint(self.core, q, k, v, use_reentrant=False)


def _block(attn_impl: str = "manual", dropout: float = 0.1) -> Block:
    torch.manual_seed(0)
    return Block(GPTConfig(block_size=4 * SEQ, n_embd=HIDDEN, n_head=HEADS, dropout=dropout,
                           attn_impl=attn_impl))


def _kept(block: nn.Module, seq: int) -> int:
    x = torch.randn(BATCH, seq, HIDDEN, requires_grad=True)
    return kept_after_forward(block, x)


def seq_doubling() -> float:
    """Measured: one block's kept bytes at 2s over those at s (fp32, dropout on)."""
    block = _block()
    return _kept(block, 2 * SEQ) / _kept(block, SEQ)


_seq_doubling = near(
    seq_doubling, 0.1,
    right="x{expected:.2f}: the orange s x s tensors quadruple, the rest double; the longer the "
          "sequence, the nearer x4.",
    low="Measured x{expected:.2f}. The softmax output, its dropout mask and the dropped-out "
        "probabilities are s x s per head: they quadruple.",
    high="Measured x{expected:.2f}. Only the s x s tensors quadruple; every tensor of s x h (the "
         "matmul inputs, the layer norms' inputs, the MLP's) doubles.")


def full_peak_cut() -> float:
    """Measured: the fraction of a plain step's peak that full recomputation removes, for the
    lesson's CPU GPT (parameter gradients allocated during the step, as in a first step)."""
    model = build_model(GPTConfig(block_size=SEQ, n_layer=LAYERS, n_head=HEADS, n_embd=HIDDEN,
                                  dropout=0.1))
    idx = torch.randint(0, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    peaks = {}
    for policy in ("none", "every"):
        model.set_policy(policy)
        model.zero_grad(set_to_none=True)
        with track_memory() as mem:
            model(idx, idx).backward()
        peaks[policy] = mem.peak_bytes
    return 1 - peaks["every"] / peaks["none"]


_full_peak_cut = near(
    full_peak_cut, 0.08,
    right="{expected:.0%}: the forward keeps 90% less, but backward still rebuilds one whole "
          "block and allocates the parameter gradients: a floor no checkpoint placement removes.",
    low="Measured {expected:.0%}: more than that, since every block's activations but one are "
        "gone at the peak.",
    high="Measured {expected:.0%}. What the forward keeps falls by about 90%, but the step's "
         "peak comes in backward: one block rebuilt in full, the gradients in flight and the "
         "parameter gradients sit on top.")


def sdpa_selective_share() -> float:
    """Measured: the share of a fused-attention (SDPA) block's kept bytes that checkpointing
    its attention core frees (dropout off: PyTorch's CPU fused path has none)."""
    block = _block("sdpa", dropout=0.0)
    plain = _kept(block, SEQ)
    block.attn.core = CheckpointedCore(block.attn.core)
    return 1 - _kept(block, SEQ) / plain


_sdpa_selective = near(
    sdpa_selective_share, 0.02,
    right="{expected:.1%}: the fused kernel saves no s x s tensor (it recomputes the scores in "
          "its own backward), so checkpointing the core frees only its small per-row statistics.",
    low="Measured {expected:.1%}. A fused kernel is selective recomputation built in: it keeps "
        "Q, K, V and one number per row, no s x s matrix, so there is almost nothing left for a "
        "checkpoint to free.")


EXERCISES = [
    Exercise("05.seq_doubling", "The lesson's block (h = 128, 4 heads, batch 4, fp32, dropout "
             "on): double the sequence from 64 to 128 tokens. Its kept bytes grow by what "
             "factor?", _seq_doubling, expected=seq_doubling),
    Exercise("05.full_peak_cut", "The lesson's CPU GPT (4 blocks, s = 64): full recomputation "
             "cuts what the forward keeps by about 90%. What fraction of the step's peak does "
             "it cut (0 to 1)?", _full_peak_cut, expected=full_peak_cut),
    Exercise("05.sdpa_selective", "With fused attention (scaled_dot_product_attention, no "
             "dropout), what fraction of a block's kept bytes does checkpointing the attention "
             "core still free (0 to 1)?", _sdpa_selective, expected=sdpa_selective_share),
]
