"""Exercises of lesson 10 (your own model): three committed predictions about the lesson's default
model, each answer measured (profile_layers, the planner, PyTorch's checkpoint) when judged."""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from ckpt_lab.checkpoint import checkpoint

from .base import Exercise, _number, near, one_of
from .lesson02 import _dropout_chain, _grads

WIDTH, BATCH = 128, 512        # the default model's CPU sizes (course.sizes' first values)


def default_model(width: int = WIDTH) -> nn.Sequential:
    """The lesson's default model, as its BRING YOUR MODEL cell builds it (seed 0)."""
    torch.manual_seed(0)

    def block(n_in, n_out, p=0.1):
        return nn.Sequential(nn.Linear(n_in, n_out), nn.GELU(), nn.Dropout(p))
    w = width
    return nn.Sequential(block(64, 4 * w), block(4 * w, 4 * w), block(4 * w, w // 2),
                         block(w // 2, 8 * w), block(8 * w, w), block(w, w), nn.Linear(w, 10))


@lru_cache(maxsize=1)
def default_profile():
    """profile_layers of the default model on a batch of BATCH (memory fields are exact)."""
    from ckpt_lab.plan.profile import profile_layers
    model = default_model().train()
    return tuple(profile_layers(list(model), torch.randn(BATCH, 64), repeats=1))


def largest_layer() -> int:
    """Index of the default model's layer that keeps the most bytes for backward."""
    profile = default_profile()
    return max(range(len(profile)), key=lambda i: profile[i].act_bytes)


def _largest_layer(answer):
    value, right = _number(answer), largest_layer()
    profile = default_profile()
    if value == right:
        return True, (f"layer {right}: it keeps GELU's input and dropout's mask at the width of "
                      "its output, the widest in the model; its own narrow input costs little.")
    if not (value == int(value) and 0 <= value < len(profile)):
        return False, f"Give a layer index from 0 to {len(profile) - 1}."
    i = int(value)
    return False, (f"Layer {i} keeps {profile[i].act_bytes / profile[right].act_bytes:.0%} of "
                   f"what layer {right} keeps: a Linear keeps its input, GELU its input, Dropout "
                   "a mask as wide as its output; the widest output wins, not the widest input.")


def least_peak_fraction() -> float:
    """The least step peak any plan reaches on the default model, over its plain step's."""
    from ckpt_lab import planner
    profile = list(default_profile())
    return planner.minimum_peak(profile) / planner.step_peak_bytes([0], profile)


_least_peak = near(
    least_peak_fraction, 0.05,
    right="{expected:.2f}: checkpointing frees what the layers keep, not the largest layer's own "
          "activations or backward's working memory, which bound it.",
    low="Too low: even the finest plan must hold one segment's activations, the inputs kept "
        "before it, and backward's working memory (gradients).",
    high="Too high: a fine plan keeps only small boundary tensors while one segment at a time is "
         "rebuilt.")


def rng_matters_for_dropout() -> bool:
    """Measured: do a Dropout chain's gradients change when the checkpoint skips the RNG replay?"""
    chain = _dropout_chain()
    x = torch.randn(64, 16)
    plain = _grads(chain, lambda f, t: f(t), x)
    loose = _grads(chain, lambda f, t: checkpoint(f, t, preserve_rng_state=False), x)
    return not all(torch.equal(a, b) for a, b in zip(plain, loose))


_rng_replay = one_of(
    (True, False), rng_matters_for_dropout,
    right="Right: without the replay the recompute draws a new dropout mask, so backward "
          "differentiates a different function than the forward ran.",
    wrong="Measured: with preserve_rng_state=False the recompute draws a new dropout mask, and "
          "the gradients differ from a plain run's.")


EXERCISES = [
    Exercise("10.largest_layer", "The lesson's default model (blocks Linear -> GELU -> Dropout, "
             "widths 64 -> 4W -> 4W -> W/2 -> 8W -> W -> W -> 10): which layer index keeps the "
             "most bytes for backward?", _largest_layer, expected=largest_layer),
    Exercise("10.least_peak", "On the default model, what is the least step peak any "
             "checkpointing plan reaches, as a fraction of the step peak without checkpoints?",
             _least_peak, expected=least_peak_fraction),
    Exercise("10.rng_replay", "A model with Dropout, checkpointed with preserve_rng_state=False: "
             "do its gradients differ from a plain run's? Answer True or False.", _rng_replay,
             expected=rng_matters_for_dropout),
]
