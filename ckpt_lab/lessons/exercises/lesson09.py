"""Exercises of lesson 9 (do the articles' numbers hold?): three committed predictions, each
answer computed from `ckpt_lab.plan.formulas`, whose chain model the lesson holds to measurements."""
from __future__ import annotations

import math

from ckpt_lab import formulas

from .base import GIB, Exercise, _number, near


def true_saving_100_10() -> float:
    """Fraction of the step peak 10 segments save on 100 one-tensor layers: (19 + 1) / (100 + 1)
    units kept, the kept segment inputs and the last segment's layers plus the gradient in flight."""
    return 1 - formulas.chain_step_peak_bytes(100, 10, 1) / formulas.chain_step_peak_bytes(100, 1, 1)


def _true_saving_100_10(answer):
    value, expected = _number(answer), true_saving_100_10()
    kept = 1 - formulas.uniform_peak_bytes(100, 10, 1, 1) / 100      # the kept-units view, 0.81
    if abs(value - expected) <= 0.015 or abs(value - kept) <= 0.005:
        return True, (f"{value:.2f} is right: about 80% (at the step peak {expected:.3f}; "
                      f"{kept:.2f} counting kept tensors alone). At the start of backward the last segment's "
                      "10 layers (never checkpointed, kept by the forward) and 9 kept inputs are "
                      "alive: 19 of 100 units, not 10.")
    if value > expected:
        return False, ("Too large: 90% counts the 10 boundaries alone. At the peak, the start "
                       "of backward, the last segment's 10 layers (never checkpointed) and the "
                       "9 other segment inputs are all kept.")
    return False, ("Too small: only the 9 kept segment inputs and the last segment's 10 layers "
                   "are alive at the peak, in units of one layer, against 100.")


def best_segments_transformer() -> int:
    """The uniform segment count of least peak for 48 layers keeping 18 units, passing on 1."""
    return formulas.optimal_segment_count(48, 18, 1)


def _best_segments_transformer(answer):
    value, expected = _number(answer), best_segments_transformer()
    peak = lambda s: formulas.uniform_peak_bytes(48, s, 18, 1)        # noqa: E731
    if value == expected:
        return True, (f"{expected} segments of {48 // expected} blocks: (S - 1) kept inputs of 1 unit plus the "
                      "last segment's blocks of 18 units is least there. Densifying pays far "
                      "beyond sqrt(48) ~ 7 when a block keeps 18 times what it passes on.")
    if value != int(value) or not 1 <= value <= 48:
        return False, "Give a whole number of segments between 1 and 48."
    s = int(value)
    cont = round(math.sqrt(48 * 18))
    why = {round(math.sqrt(48)): "sqrt(L) is the bottom when a layer keeps what it passes on "
                                 "(a = b); here a = 18 b moves it right",
           cont: f"sqrt(L a / b) ~ {cont} is the continuous optimum, but checkpoint_sequential "
                 f"gives each of {cont} segments 48 // {cont} = {48 // cont} block(s) and the "
                 f"last one the other {48 - (cont - 1) * (48 // cont)}"}.get(s, "")
    return False, (f"S = {s} peaks at {peak(s)} units against {peak(expected)} at the best"
                   + (f": {why}." if why else ". Evaluate (S - 1) + 18 x (blocks in the last "
                      "segment) for every S."))


def accumulation_bound() -> float:
    """At most what checkpointing plus accumulation can divide the step peak of a model of 7e9
    parameters by (60 GiB of activations on top of mixed-precision Adam's state):
    (state + activations) / state."""
    state = formulas.model_state_bytes(7_000_000_000, "mixed", "adam")
    return (state + 60 * GIB) / state


_accumulation_bound = near(
    accumulation_bound, 0.02, relative=True,
    low="Too small: divide the whole peak (model state + activations) by the part no activation "
        "technique removes, the model state.",
    high="Too large: model state does not shrink: mixed-precision Adam keeps 16 bytes per "
         "parameter (formulas.model_state_bytes(7e9, 'mixed', 'adam')).")


EXERCISES = [
    Exercise("09.true_saving_100_10", "Article B's model (one B x S x H tensor per layer), 100 "
             "layers, torch's checkpoint_sequential with 10 segments: what fraction of the step "
             "peak does it really save (a number between 0 and 1)?", _true_saving_100_10,
             expected=true_saving_100_10),
    Exercise("09.best_segments_transformer", "48 transformer blocks that each keep 18 units "
             "for backward and pass on 1 unit: which uniform segment count S gives the least "
             "step peak?", _best_segments_transformer, expected=best_segments_transformer),
    Exercise("09.accumulation_bound", "A model of 7e9 parameters (not Llama 2 7B's 6.74e9) "
             "trained with mixed-precision Adam (16 bytes per parameter) whose activations take "
             "60 GiB without checkpointing: by at most "
             "what factor can checkpointing plus accumulation lower the step peak?",
             _accumulation_bound, expected=accumulation_bound),
]
