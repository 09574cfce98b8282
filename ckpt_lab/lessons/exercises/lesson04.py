"""Predictions of lesson 4 (what recomputation costs, in FLOPs and in time).

Each right answer is measured when it is needed: FLOPs counted by PyTorch's
`FlopCounterMode` on the lesson's CPU-sized GPT, the GPU time read from the course's
committed H200 run.
"""
from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.training.models import GPTConfig, build_model

from .base import Exercise, _number, near

# The lesson's CPU sizes (course.sizes picks them on a CPU).
LAYERS, HIDDEN, HEADS, SEQ, BATCH = 4, 128, 4, 64, 4


def _gpt(dropout: float = 0.1):
    model = build_model(GPTConfig(block_size=SEQ, n_layer=LAYERS, n_head=HEADS, n_embd=HIDDEN,
                                  dropout=dropout))
    idx = torch.randint(0, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return model, idx


def _flops(step) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def step_flops(policy: str = "none", dropout: float = 0.1) -> int:
    """Counted FLOPs of one step of the lesson's CPU GPT under a model policy."""
    model, idx = _gpt(dropout)
    model.set_policy(policy)
    return _flops(lambda: model(idx, idx).backward())


def full_flops_ratio() -> float:
    """Measured: FLOPs of a step with torch's checkpoint around every block over a plain one,
    for the lesson's GPT without dropout (as most large language models train)."""
    model, idx = _gpt(dropout=0.0)
    layers = model.layers()

    def step(ckpt: bool):
        h = layers[0](idx)
        for block in layers[1:-1]:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False) if ckpt \
                else block(h)
        model.loss(layers[-1](h), idx).backward()

    return _flops(lambda: step(True)) / _flops(lambda: step(False))


def _full_flops(answer):
    value, expected = _number(answer), full_flops_ratio()
    if math.isclose(value, expected, rel_tol=0.04):
        return True, (f"x{expected:.3f}: backward re-runs every block's forward except its MLP "
                      "down projection. Without dropout the last tensor backward needs from a "
                      "block is that matmul's input, so the recompute stops early, before it. "
                      "With dropout the mask after it must be redrawn: a little under 4/3.")
    if value >= 1.45:
        return False, (f"Measured x{expected:.3f}. Backward re-runs the forward at most once (F), "
                       "it does not repeat the backward: F + 2F becomes at most F + 2F + F.")
    if value >= 1.28:
        return False, (f"Measured x{expected:.3f}, less than 4/3: a non-reentrant checkpoint "
                       "stops its recompute early (lesson 2), at the last tensor backward needs. "
                       "Without dropout that is the down projection's input, so the down "
                       "projection, a third of the block's weight FLOPs, never re-runs.")
    return False, (f"Measured x{expected:.3f}. Every block's forward runs again, less what early "
                   "stop skips (the down projection); backward costs about twice the forward, so "
                   "that is most of a third of the step.")


def selective_matmuls() -> float:
    """Measured: selective recomputation's extra FLOPs in units of one layer's Q K^T each."""
    extra = step_flops("selective") - step_flops("none")
    return extra / (LAYERS * 2 * BATCH * SEQ ** 2 * HIDDEN)


_selective_matmuls = near(
    selective_matmuls, 0,
    right="one: the recompute stops early, as soon as it has rebuilt the last tensor backward "
          "needs. softmax . V saves only its inputs (the dropped-out probabilities and V), which "
          "exist before it runs, so it never runs.",
    low="Measured: {expected:g}. Backward needs the softmax output, and the softmax needs Q K^T: "
        "that matmul is re-run.",
    high="Measured: {expected:g}. Megatron's count charges both matmuls, but a non-reentrant "
         "checkpoint stops at the last saved tensor: . V saves only its inputs, so it is never "
         "re-run.")


def h200_selective_time() -> float | None:
    """Selective recomputation's added step time on the committed H200 run, in percent."""
    from ckpt_lab.lessons import committed
    found = committed.policies()
    return None if found is None else 100 * (found["selective"]["time"] - 1)


def _selective_time(answer):
    value = _number(answer)
    expected = h200_selective_time()
    if expected is None:
        return False, "This installation has no committed GPU run to compare with."
    flops = 100 * (_committed("selective", "FLOPs") - 1)
    if abs(value - expected) <= 5:
        return True, (f"+{expected:.1f}% of the time for +{flops:.1f}% of the FLOPs: the mask, "
                      "softmax and dropout it re-runs count no FLOPs but read and write "
                      "s x s tensors.")
    if value < expected:
        return False, (f"Measured +{expected:.1f}%. FLOPs count only the matmuls; the softmax, "
                       "mask and dropout the core re-runs cost memory traffic, not FLOPs.")
    full = 100 * (_committed("every", "time") - 1)
    return False, (f"Measured +{expected:.1f}%: far less than full recomputation's "
                   f"+{full:.0f}%; only the attention cores run again.")


def _committed(policy: str, kind: str) -> float:
    from ckpt_lab.lessons import committed
    return committed.policies()[policy][kind]


EXERCISES = [
    Exercise("04.full_flops", "Full recomputation (torch's checkpoint around every block of "
             "the lesson's GPT, without dropout, as most large language models train): a step's "
             "FLOPs, as a multiple of a plain step's?",
             _full_flops, expected=full_flops_ratio),
    Exercise("04.selective_matmuls", "Selective recomputation checkpoints each attention core "
             "(Q K^T, mask, softmax, dropout, . V). How many of the core's two matmuls does "
             "backward re-run: 0, 1 or 2?", _selective_matmuls, expected=selective_matmuls),
    Exercise("04.selective_time", "On the committed H200 run, selective recomputation adds "
             "a few percent to a step's FLOPs. How much does it add to the step's time, in percent?",
             _selective_time, expected=h200_selective_time),
]
