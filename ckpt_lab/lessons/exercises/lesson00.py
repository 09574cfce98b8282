"""Predictions of the tour: what checkpointing gives back, and what it leaves unchanged.

Each answer is measured at the tour's CPU sizes (12 blocks of width 128, 16 rows of 64 bytes,
vocabulary 256) with PyTorch's own ``checkpoint_sequential``, the call the tour shows.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .base import Exercise, near, one_of

TOUR = dict(block_size=64, width=128, depth=12)
BATCH = 16
LOSS_ANSWERS = ("identical", "close", "different")
SEGMENTS = 4            # the tour's segments of the model's L + 2 layers (embedding, L blocks, head)


def _model_and_batches():
    from ckpt_lab.training.data import TextBatches, load_corpus
    from ckpt_lab.training.models import MLPConfig, build_model
    config = MLPConfig(**TOUR)
    batches = TextBatches(load_corpus(), BATCH, TOUR["block_size"])
    return (lambda: build_model(config)), batches


def _step(model, x, y, segments: int):
    from torch.utils.checkpoint import checkpoint_sequential
    logits = checkpoint_sequential(model.layers(), segments, x, use_reentrant=False)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    return loss


@functools.lru_cache(maxsize=1)
def peak_ratio() -> float:
    """Measured: the checkpointed step's step peak (activations) over the plain step's, at the
    tour's CPU sizes, the gradients allocated before each step as the tour does."""
    from ckpt_lab.measure.memory import track_memory
    make, batches = _model_and_batches()
    x, y = batches.get(0)
    peaks = []
    for plain in (True, False):
        model = make()
        for p in model.parameters():        # model state, allocated before the step
            p.grad = torch.zeros_like(p)
        with track_memory() as mem:
            _step(model, x, y, 1 if plain else SEGMENTS)
        peaks.append(mem.peak_bytes)
    return peaks[1] / peaks[0]


@functools.lru_cache(maxsize=2)
def losses_verdict(steps: int = 4) -> str:
    """Measured: "identical", "close" or "different" for the losses of training both ways."""
    make, batches = _model_and_batches()
    losses = []
    for plain in (True, False):
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = []
        for step in range(steps):
            run.append(_step(model, *batches.get(step), 1 if plain else SEGMENTS).item())
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(run)
    if losses[0] == losses[1]:
        return "identical"
    return "close" if all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(*losses)) else "different"


_peak_ratio = near(
    peak_ratio, 0.1,
    right="measured {expected:.2f}: the checkpoints free the activations of every segment but "
          "the last, not the loss's tensors.",
    low="Measured {expected:.2f}, a smaller saving than you guessed: the peak falls at the "
        "loss's backward, where the logits and their gradients (tokens x vocabulary, which no "
        "checkpoint of the chain removes) and the last segment's activations are alive together.",
    high="Measured {expected:.2f}: checkpointing does lower the peak. Three of the four segments "
         "keep only their input after the forward; backward rebuilds them one at a time.")

_losses = one_of(
    LOSS_ANSWERS, losses_verdict,
    right="identical, bit for bit: the recompute performs the very same operations in the same "
          "order on the same numbers, so even the rounding repeats.",
    wrong="Measured: {expected}. Floating-point rounding differs only when the operations or "
          "their order differ; a recompute repeats both exactly (and replays the random "
          "generator, so a dropout mask repeats too).")


EXERCISES = [
    Exercise("00.peak_ratio", "Guess (nothing yet lets you work it out): the tour's MLP (12 "
             "blocks of width 128, vocabulary 256, 1,024 tokens) in 4 segments with "
             "checkpoint_sequential: its step peak (activations) is what fraction of the plain "
             "step's? (e.g. 1.0, 0.7, 0.5 or 0.25)", _peak_ratio,
             expected=peak_ratio),
    Exercise("00.same_losses", "Train the model 4 steps plain and 4 steps with checkpoints, "
             "same seed, same batches: are the losses 'identical' (bit for bit), 'close' "
             "(rounding differs) or 'different'?", _losses, expected=losses_verdict),
]
