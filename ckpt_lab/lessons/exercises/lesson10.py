"""Exercises of lesson 10: Your own model."""
from __future__ import annotations

import torch

from ckpt_lab.checkpoint import checkpoint

from .base import Exercise, _close
from .lesson02 import _dropout_chain, _grads
from .lesson06 import SHRINKING_ACT, SHRINKING_OUT


def _minimum_budget(answer):
    from ckpt_lab.planner import BudgetTooSmallError, optimal_segments
    try:
        optimal_segments(SHRINKING_ACT, SHRINKING_OUT, [1] * len(SHRINKING_ACT), 0)
    except BudgetTooSmallError as e:
        expected = e.minimum_bytes
    return _close(answer, expected, 1e-9,
                  "Too small: no plan fits that. Every segment's activations plus the inputs "
                  "kept before it must fit; catch BudgetTooSmallError and read .minimum_bytes.",
                  "Too large: a finer plan fits a smaller budget; ask the planner with budget 0 "
                  "and read BudgetTooSmallError.minimum_bytes.")


def rng_matters_for_dropout() -> bool:
    """Measured: do a Dropout chain's gradients change when the checkpoint skips the RNG replay?"""
    chain = _dropout_chain()
    x = torch.randn(64, 16)
    plain = _grads(chain, lambda f, t: f(t), x)
    loose = _grads(chain, lambda f, t: checkpoint(f, t, preserve_rng_state=False), x)
    return not all(torch.equal(a, b) for a, b in zip(plain, loose))


def _rng_replay(answer):
    if not isinstance(answer, bool):
        return False, "Answer True or False."
    expected = rng_matters_for_dropout()
    if answer == expected:
        return True, ("Right: without the replay the recompute draws a new dropout mask, so "
                      "backward differentiates a different function than the forward ran.")
    return False, ("Try it: checkpoint(..., preserve_rng_state=False) on a model with Dropout, "
                   "then compare gradients with torch.equal against a plain run.")


EXERCISES = [
    Exercise("10.minimum_budget", "The chain of exercise 06.plan_recompute ([4, 4, 4, 4, 2, 2, "
             "2, 2, 1, 1, 1, 1] units kept, outputs [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]): what is "
             "the least budget, in units, that the planner accepts?", _minimum_budget),
    Exercise("10.rng_replay", "A model with Dropout, checkpointed with preserve_rng_state=False: "
             "do its gradients differ from a plain run's? Answer True or False.", _rng_replay),
]
