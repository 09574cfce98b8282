"""Exercises of lesson 5 (which activations grow with the sequence, and selective
recomputation). Each prediction's right answer is measured when it is needed, with
`track_memory` on the lesson's CPU-sized block and GPT; the build task (`05.block_bytes`) runs
the learner's count of a block's kept bytes against `kept_after_forward` of real blocks."""
from __future__ import annotations

import functools

import numpy as np
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


@functools.lru_cache(maxsize=1)
def seq_doubling() -> float:
    """Measured: one block's kept bytes at 2T over those at T (fp32, dropout on)."""
    block = _block()
    return _kept(block, 2 * SEQ) / _kept(block, SEQ)


_seq_doubling = near(
    seq_doubling, 0.1,
    right="x{expected:.2f}: the orange T x T tensors quadruple, the rest double; the longer the "
          "sequence, the nearer x4.",
    low="Measured x{expected:.2f}. The softmax output, its dropout mask and the dropped-out "
        "probabilities are T x T per head: they quadruple.",
    high="Measured x{expected:.2f}. Only the T x T tensors quadruple; every tensor of T x H (the "
         "matmul inputs, the layer norms' inputs, the MLP's) doubles.")


@functools.lru_cache(maxsize=1)
def full_peak_cut() -> float:
    """Measured: the fraction of a plain step's step peak (activations) that full recomputation
    removes, for the lesson's CPU GPT, the parameter gradients allocated before the step."""
    model = build_model(GPTConfig(block_size=SEQ, n_layer=LAYERS, n_head=HEADS, n_embd=HIDDEN,
                                  dropout=0.1))
    idx = torch.randint(0, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    peaks = {}
    for policy in ("none", "every"):
        model.set_policy(policy)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)              # model state, allocated before measuring
        with track_memory() as mem:
            model(idx, idx).backward()
        peaks[policy] = mem.peak_bytes
    return 1 - peaks["every"] / peaks["none"]


_full_peak_cut = near(
    full_peak_cut, 0.08,
    right="{expected:.0%}: the forward keeps 90% less, but backward still rebuilds one whole "
          "block on top of the kept inputs, with the gradients in flight: a floor no checkpoint "
          "placement removes.",
    low="Measured {expected:.0%}: more than that, since every block's activations but one are "
        "gone at the peak.",
    high="Measured {expected:.0%}. What the forward keeps falls by about 90%, but the step's "
         "peak comes in backward: one block rebuilt in full and the gradients in flight sit on "
         "top of the kept inputs.")


@functools.lru_cache(maxsize=1)
def sdpa_selective_share() -> float:
    """Measured: the share of a fused-attention (SDPA) block's kept bytes that checkpointing
    its attention core frees (dropout off: PyTorch's CPU fused path has none)."""
    block = _block("sdpa", dropout=0.0)
    plain = _kept(block, SEQ)
    block.attn.core = CheckpointedCore(block.attn.core)
    return 1 - _kept(block, SEQ) / plain


_sdpa_selective = near(
    sdpa_selective_share, 0.02,
    right="{expected:.1%}: the fused kernel saves no T x T tensor (it recomputes the scores in "
          "its own backward), so checkpointing the core frees only its small per-row statistics.",
    low="Measured {expected:.1%}. A fused kernel is selective recomputation built in: it keeps "
        "Q, K, V and one number per row, no T x T matrix, so there is almost nothing left for a "
        "checkpoint to free.")


# The build task's sizes (B, T, H, n_h): the four kinds of term grow differently across them,
# so a miscount of any one kind shows up and can be named.
BLOCK_SIZES = ((4, 64, 128, 4), (2, 16, 32, 2), (3, 40, 48, 3), (1, 96, 64, 8), (2, 24, 96, 6))
# What each kind of term grows with, in the course's letters (docs/notation.md).
_KINDS = {
    "the T·B·H terms (per element of a T × B × H tensor)": lambda B, T, H, n_h: T * B * H,
    "the T × T terms (per head and element of a T × T matrix)": lambda B, T, H, n_h: n_h * T * T * B,
    "the layer norms' statistics (per token)": lambda B, T, H, n_h: B * T,
    "the causal mask (per element of one T × T matrix)": lambda B, T, H, n_h: T * T,
}


def measured_block_bytes(B: int, T: int, H: int, n_h: int) -> int:
    """Measured: bytes one GPT block (dropout on, fp32, on the CPU) keeps after its forward."""
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=T, n_embd=H, n_head=n_h, dropout=0.1))
    return kept_after_forward(block, torch.randn(B, T, H, requires_grad=True))


def _miscounted(rows) -> str:
    """Which kinds of term a wrong count is off by, and by how many bytes each, when the
    differences fit the four kinds exactly (least squares over the sizes)."""
    basis = np.array([[f(*size) for f in _KINDS.values()] for size, _, _ in rows], float)
    diff = np.array([yours - measured for _, yours, measured in rows], float)
    coef, *_ = np.linalg.lstsq(basis, diff, rcond=None)
    if not np.allclose(basis @ np.round(coef), diff):
        return ""
    off = [f"{name}: {'+' if c > 0 else ''}{c:g} bytes" for name, c in zip(_KINDS, np.round(coef)) if c]
    return " Your count is off in " + "; ".join(off) + "."


def _block_bytes(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('05.block_bytes', "
                       "block_bytes), taking (B, T, H, n_h) and returning bytes.")
    rows = []
    for size in BLOCK_SIZES:
        try:
            yours = answer(*size)
        except Exception as e:  # the learner's code: report, do not raise
            return False, f"block_bytes{size} raised {type(e).__name__}: {e}"
        if yours is None:
            return False, ("not answered yet: your block_bytes returns None. Write its body: "
                           "the table's terms in fp32, and the three small ones.")
        if isinstance(yours, bool) or not isinstance(yours, (int, float)):
            return False, f"block_bytes{size} returned {yours!r}; return a number of bytes."
        rows.append((size, yours, measured_block_bytes(*size)))
    wrong = [(size, yours, measured) for size, yours, measured in rows if yours != measured]
    if not wrong:
        shown = ", ".join(f"{m:,}" for _, _, m in rows)
        return True, (f"exact at all {len(rows)} sizes ({shown} bytes measured by "
                      "kept_after_forward): Megatron's terms in fp32, plus the three small ones.")
    size, yours, measured = wrong[0]
    return False, (f"block_bytes{size} = {yours:,} where the block keeps {measured:,} bytes "
                   f"(B, T, H, n_h = {size})." + _miscounted(rows)
                   + " In fp32 an activation element is 4 bytes, and on a CPU so is a dropout "
                     "mask's.")


EXERCISES = [
    Exercise("05.seq_doubling", "The lesson's block (H = 128, n_h = 4 heads, B = 4, fp32, "
             "dropout on): double the sequence length T from 64 to 128 tokens. Its kept bytes "
             "grow by what factor?", _seq_doubling, expected=seq_doubling),
    Exercise("05.full_peak_cut", "The lesson's CPU GPT (4 blocks, T = 64): full recomputation "
             "cuts what the forward keeps by about 90%. What fraction of the step peak "
             "(activations; the parameter gradients allocated before the step, as model state) "
             "does it cut (0 to 1)?", _full_peak_cut, expected=full_peak_cut),
    Exercise("05.sdpa_selective", "With fused attention (scaled_dot_product_attention, no "
             "dropout), what fraction of a block's kept bytes does checkpointing the attention "
             "core still free (0 to 1)?", _sdpa_selective, expected=sdpa_selective_share),
    Exercise("05.block_bytes", "Build task: write block_bytes(B, T, H, n_h), the bytes one GPT "
             "block (ckpt_lab.training.models.Block, dropout on) keeps for backward in fp32 on a CPU, "
             "where a dropout mask costs 4 bytes per element: Megatron's terms and the three "
             "small ones. The check compares it with kept_after_forward of blocks of "
             f"{len(BLOCK_SIZES)} sizes.", _block_bytes),
]
