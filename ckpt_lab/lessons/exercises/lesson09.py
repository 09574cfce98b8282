"""Exercises of lesson 9: Checking the claims."""
from __future__ import annotations

from ckpt_lab import formulas

from .base import GIB, Exercise, _close, _number


def _true_saving_100_10(answer):
    expected = 1 - formulas.corrected_mem_ckpt(100, 8, 512, 1024) / \
        formulas.article_mem_no_ckpt(100, 8, 512, 1024)
    return _close(answer, expected, 0.01,
                  "Too small: count only the 9 kept segment inputs and the 10 layers of the "
                  "segment being rebuilt, in units of one layer, against 100 units.",
                  "Too large: backward rebuilds a whole 10-layer segment while 9 kept inputs "
                  "wait; the boundaries alone (the article's 90%) are not the peak.")


def _best_segments_transformer(answer):
    expected = formulas.optimal_segment_count(48, 18, 1)
    value = _number(answer)
    if value == expected:
        return True, (f"{expected} segments: with a = 18 b the optimum moves far beyond "
                      "sqrt(48) ~ 7, towards sqrt(L a / b).")
    return False, ("Compute (S - 1) * 1 + (layers in the last segment) * 18 for each S "
                   "(formulas.uniform_peak_bytes(48, S, 18, 1)) and take the least; "
                   "about sqrt(L a / b).")


def _accumulation_bound(answer):
    state = formulas.model_state_bytes(7_000_000_000, "mixed", "adam")
    expected = (state + 60 * GIB) / state
    return _close(answer, expected, 0.02,
                  "Too small: divide the whole peak (model state + activations) by the part "
                  "no activation technique removes, the model state.",
                  "Too large: model state does not shrink: mixed-precision Adam keeps 16 bytes "
                  "per parameter (formulas.model_state_bytes(7e9, 'mixed', 'adam')).")


EXERCISES = [
    Exercise("09.true_saving_100_10", "Article B's model (one B x S x H tensor per layer), 100 "
             "layers, checkpoint_sequential with 10 segments: what fraction of activation "
             "memory is really saved at the peak (a number between 0 and 1)?",
             _true_saving_100_10),
    Exercise("09.best_segments_transformer", "48 layers that each keep a = 18 units and pass on "
             "b = 1 unit (a transformer block): which uniform segment count gives the least "
             "peak?", _best_segments_transformer),
    Exercise("09.accumulation_bound", "A 7B model trained with mixed-precision Adam (16 bytes "
             "per parameter) whose activations take 60 GiB without checkpointing: by at most "
             "what factor can checkpointing plus accumulation lower the peak?",
             _accumulation_bound),
]
