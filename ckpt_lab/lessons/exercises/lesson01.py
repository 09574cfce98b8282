"""Exercises of lesson 1: Where the memory goes."""
from __future__ import annotations

import torch
from torch import nn

from ckpt_lab import formulas

from .base import GIB, Exercise, _close

FROZEN_ADAMW_CONFIG = dict(block_size=16, width=64, depth=3)


def frozen_adamw_step_bytes() -> int:
    """Measured: the bytes the first AdamW step adds to the 01.1 model (embedding frozen)."""
    from ckpt_lab.memory import track_memory
    from ckpt_lab.models import MLPConfig, build_model
    model = build_model(MLPConfig(**FROZEN_ADAMW_CONFIG))
    model.chain[0].requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (4, FROZEN_ADAMW_CONFIG["block_size"]))
    model(x, x).backward()
    with track_memory() as mem:
        optimizer.step()
    return mem.current_bytes


def _frozen_adamw(answer):
    expected = frozen_adamw_step_bytes()
    return _close(answer, expected, 1e-3,
                  "Too few: AdamW keeps two fp32 tensors (exp_avg and exp_avg_sq) the size of "
                  "every parameter it updates, 8 bytes per parameter: count the biases and the "
                  "head's weight too, not only the blocks' weights.",
                  "Too many: a frozen parameter gets no gradient, and AdamW skips a parameter "
                  "whose .grad is None, so the embedding gets no state. Count only the blocks "
                  "and the head, 8 bytes per parameter (the step counters add 4 bytes per "
                  "tensor, within the tolerance).")


def _block_bytes(answer):
    from ckpt_lab.models import MLPBlock
    from ckpt_lab.profile import profile_layers
    tokens, width = 8 * 64, 512
    torch.manual_seed(0)
    chain = nn.Sequential(*[MLPBlock(width) for _ in range(3)])
    prof = profile_layers(chain, torch.randn(tokens, width), repeats=1)
    expected = prof[1].act_bytes
    return _close(answer, expected, 1e-3,
                  "Too few: ReLU's backward needs its output, so the block keeps one "
                  "(tokens x width) fp32 tensor; tokens = batch x positions = 8 x 64.",
                  "Too many: do not count the block's input: it is the previous block's ReLU "
                  "output, already kept by that block (the Linear reuses it). And the Linear's "
                  "output is freed once ReLU has made and saved its own output.")


def _adam_fp32_7b(answer):
    expected = formulas.model_state_bytes(7_000_000_000, "fp32", "adam") / GIB
    return _close(answer, expected, 0.02,
                  "Too few: fp32 Adam keeps weights, gradients and two moments: 4 numbers of "
                  "4 bytes per parameter. Convert bytes to GiB by dividing by 2**30.",
                  "Too many: 16 bytes per parameter; 1 GiB is 2**30 bytes (not 10**9).")


EXERCISES = [
    Exercise("01.frozen_adamw_bytes", "Predict, then measure: build_model(MLPConfig("
             "block_size=16, width=64, depth=3)) with its embedding frozen "
             "(model.chain[0].requires_grad_(False)), all parameters given to AdamW, after one "
             "forward + backward: how many bytes does the first optimizer.step() add? Work it "
             "out from the shapes first (vocabulary 256), then measure it with track_memory.",
             _frozen_adamw),
    Exercise("01.block_activation_bytes", "One MLPBlock (Linear -> ReLU, width 512, fp32, no "
             "dropout) in the middle of a chain, batch of 8 rows x 64 positions: how many bytes "
             "does this block add to what the chain keeps for backward? Count the tensors the "
             "block creates and keeps; its input is the previous block's output, kept by that "
             "block, so it does not count here.", _block_bytes),
    Exercise("01.adam_fp32_7b", "A 7-billion-parameter model trained in fp32 with Adam: how "
             "many GiB do weights, gradients and optimizer states take?", _adam_fp32_7b),
]
