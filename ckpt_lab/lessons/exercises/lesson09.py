"""Exercises of lesson 9 (do the articles' numbers hold?): three committed predictions, each
answer computed from `ckpt_lab.formulas`, whose chain model the lesson holds to measurements;
and one build task, article B's checkpointed memory written correctly, judged against the step
peaks torch's `checkpoint_sequential` reaches under `track_memory`."""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from ckpt_lab import formulas, track_memory
from ckpt_lab.models import MLPBlock

from .base import GIB, Exercise, _number, near


def true_saving_100_10() -> float:
    """Fraction of the step peak 10 segments save on 100 one-tensor layers: (19 + 1) / (100 + 1)
    units kept: the kept segment inputs, the last segment's layers, the gradient in flight."""
    peak = formulas.chain_step_peak_bytes
    return 1 - peak(100, 10, 1) / peak(100, 1, 1)


def _true_saving_100_10(answer):
    value, expected = _number(answer), true_saving_100_10()
    kept = 1 - formulas.uniform_peak_bytes(100, 10, 1, 1) / 100      # the kept-units view, 0.81
    if abs(value - expected) <= 0.015 or abs(value - kept) <= 0.005:
        return True, (f"{value:.2f} is right: about 80% (at the step peak {expected:.3f}; "
                      f"{kept:.2f} counting kept tensors alone). At the start of backward the "
                      "last segment's 10 layers (never checkpointed, kept by the forward) and "
                      "9 kept inputs are alive: 19 of 100 units, not 10.")
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
        return True, (f"{expected} segments of {48 // expected} blocks: (S - 1) kept inputs "
                      "of 1 unit plus the last segment's blocks of 18 units is least there. "
                      "Densifying pays far beyond sqrt(48) ~ 7 when a block keeps 18 times what "
                      "it passes on.")
    if value != int(value) or not 1 <= value <= 48:
        return False, "Give a whole number of segments between 1 and 48."
    s = int(value)
    cont = round(math.sqrt(48 * 18))
    why = {round(math.sqrt(48)): "sqrt(L) is the bottom when a layer keeps what it passes on "
                                 "(A = X); here A = 18 X moves it right",
           cont: f"sqrt(L A / X) ~ {cont} is the continuous optimum, but checkpoint_sequential "
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


# The build task: (L, S) pairs the learner's formula must meet, and the chain's sizes (B, T, H),
# fp32. One layer's tensor (a unit) is B T H 4 = 32 KiB; a block's weight gradient, 1 KiB,
# stays within the tolerance.
FORMULA_CASES = ((100, 10), (48, 7), (30, 4), (16, 1), (12, 12), (20, 3))
FORMULA_SIZES = (4, 128, 16)
FORMULA_TOLERANCE = 0.03


@lru_cache(maxsize=None)
def measured_step_peak(L: int, S: int, B: int, T: int, H: int) -> int:
    """Step peak (activations) of L blocks Linear -> ReLU (width H, on B T tokens, fp32) in S
    segments under torch's checkpoint_sequential; the weights' gradients exist first."""
    torch.manual_seed(0)
    chain = nn.Sequential(*[MLPBlock(H) for _ in range(L)])
    x = torch.randn(B * T, H)
    for p in chain.parameters():
        p.grad = torch.zeros_like(p)
    run, threads = torch.utils.checkpoint.checkpoint_sequential, torch.get_num_threads()
    torch.set_num_threads(1)                     # tiny tensors: one thread is faster
    try:
        with track_memory() as mem:              # no name holds the output through backward
            run(chain, S, x, use_reentrant=False).sum().backward()
    finally:
        torch.set_num_threads(threads)
    return mem.peak_bytes


def _formula_hint(rows, unit: int) -> str:
    """Why a formula misses: the measured peak minus the learner's, in units, per (L, S)."""
    short = {(L, S): (measured - got) / unit for L, S, got, measured in rows}
    worst = max(short, key=lambda k: abs(short[k]))
    L, S = worst
    where = (f"At L = {L}, S = {S} yours is {abs(short[worst]):.1f} units (one unit: one "
             f"layer's tensor) {'below' if short[worst] > 0 else 'above'} the measured step "
             "peak. ")
    if all(abs(v - 1) < 0.2 for v in short.values()):
        return where + ("One unit short everywhere: backward's first gradient (one layer's tensor) "
                        "is alive at the peak too.")
    if all(abs(v) < 0.2 for k, v in short.items() if k[0] % k[1] == 0):
        return where + ("Right where S divides L, wrong elsewhere: checkpoint_sequential gives "
                        "each segment L // S blocks and the last one all the rest.")
    if short[worst] > 0:
        return where + ("Count what is alive at the start of backward: the inputs of the S - 1 "
                        "checkpointed segments, every layer of the last segment, and the first "
                        "gradient.")
    return where + ("Too much: the first segment's input is the model's input (held by the "
                    "caller, not counted), and the checkpointed segments keep only their inputs.")


def _step_peak_formula(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('09.step_peak_formula', "
                       "step_peak), a function (L, S, B, T, H, byte_per=2) -> bytes.")
    B, T, H = FORMULA_SIZES
    unit = B * T * H * 4
    rows = []
    for L, S in FORMULA_CASES:
        try:
            got = answer(L, S, B, T, H, byte_per=4)
        except Exception as e:  # the learner's code: report, do not raise
            return False, (f"step_peak({L}, {S}, {B}, {T}, {H}, byte_per=4) raised "
                           f"{type(e).__name__}: {e}")
        if got is None:
            return False, ("not answered yet: step_peak returns None. Write its body: count the "
                           "tensors alive at the step peak (the hint above the cell).")
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return False, f"step_peak should return a number of bytes, got {got!r}."
        rows.append((L, S, got, measured_step_peak(L, S, B, T, H)))
    off = [(L, S, got / measured) for L, S, got, measured in rows
           if abs(got / measured - 1) > FORMULA_TOLERANCE]
    if off:
        return False, _formula_hint(rows, unit)
    yours = answer(100, 10, 8, 512, 1024)
    theirs = (10 + 1 + 2) * 8 * 512 * 1024 * 2      # article B's: 11 boundaries + "2 layers"
    return True, (f"Within {FORMULA_TOLERANCE:.0%} of torch's checkpoint_sequential at "
                  f"{len(rows)} depths and segment counts. At article B's size yours gives "
                  f"{yours / 2 ** 20:,.0f} MiB for 10 segments of 100 layers; its formula "
                  f"gives {theirs / 2 ** 20:,.0f} MiB.")


EXERCISES = [
    Exercise("09.true_saving_100_10", "Article B's model (one B x T x H tensor per layer), 100 "
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
    Exercise("09.step_peak_formula", "Build task: pass your function step_peak(L, S, B, T, H, "
             "byte_per=2), the step peak (activations) in bytes of article B's model, L layers "
             "that each keep one B x T x H tensor, in S segments under checkpoint_sequential. "
             "It is checked against track_memory at several L and S.", _step_peak_formula),
]
