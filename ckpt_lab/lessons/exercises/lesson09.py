"""Exercises of lesson 9 (do the articles' numbers hold?): three committed predictions, each
answer computed from `ckpt_lab.plan.formulas`, whose chain model the lesson holds to measurements;
and one build task, the step peak of GPT blocks in S segments from three measured numbers (what
a block keeps, what it passes on, the plain step's peak), judged against the step peaks torch's
`checkpoint_sequential` reaches under `track_memory`."""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from ckpt_lab import formulas, profile_layers, track_memory
from ckpt_lab.training.models import GPTConfig, build_model

from .base import GIB, Exercise, _number, near
from .threads import one_thread


def true_saving_100_10() -> float:
    """Fraction of the step peak 10 segments save on 100 one-tensor layers (article 2's model):
    (19 + 1) / (100 + 1) units kept: the kept segment inputs, the last segment's layers, the
    gradient in flight."""
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
    """At most what checkpointing plus accumulation can divide the total peak (model state
    included) of a model of 7e9 parameters by (60 GiB of activations on top of mixed-precision
    Adam's state): (state + activations) / state."""
    state = formulas.model_state_bytes(7_000_000_000, "mixed", "adam")
    return (state + 60 * GIB) / state


_accumulation_bound = near(
    accumulation_bound, 0.02, relative=True,
    low="Too small: divide the whole peak (model state + activations) by the part no activation "
        "technique removes, the model state.",
    high="Too large: model state does not shrink: mixed-precision Adam keeps 16 bytes per "
         "parameter (formulas.model_state_bytes(7e9, 'mixed', 'adam')).")


# The build task: (L, S) pairs of GPT blocks the learner's prediction must meet, at a tiny size
# (fp32, CPU, one thread). A block keeps about 18 times what it passes on (A = 18 X).
GPT_CASES = ((12, 1), (12, 2), (12, 3), (12, 5), (12, 7), (12, 12), (8, 3), (8, 8))
GPT_SIZE = dict(block_size=32, n_head=2, n_embd=32, batch=4)
GPT_TOLERANCE = 0.01


@lru_cache(maxsize=None)
def gpt_blocks(L: int):
    """L blocks of the course's GPT at GPT_SIZE (seed 0, no dropout), and their input: the
    embedding's output for a batch of token ids."""
    size = dict(GPT_SIZE)
    batch = size.pop("batch")
    torch.manual_seed(0)
    model = build_model(GPTConfig(n_layer=L, dropout=0.0, **size))
    blocks = nn.Sequential(*model.blocks())
    with torch.no_grad():
        h = model.layers()[0](torch.randint(0, 256, (batch, size["block_size"])))
    return blocks, h


@lru_cache(maxsize=None)
def measured_gpt_peak(L: int, S: int) -> int:
    """Step peak (activations) of `gpt_blocks(L)` in S segments under torch's
    checkpoint_sequential, `.sum().backward()`; the weights' gradients exist first."""
    blocks, h = gpt_blocks(L)
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)
    with one_thread(), track_memory() as mem:
        run = torch.utils.checkpoint.checkpoint_sequential
        run(blocks, S, h, use_reentrant=False).sum().backward()
    return mem.peak_bytes


@lru_cache(maxsize=None)
def gpt_pieces(L: int) -> tuple[int, int, int]:
    """(A, X, plain peak) of `gpt_blocks(L)`: what one block keeps for backward and what it
    passes on (`profile_layers` of a middle block), and the step peak without checkpoints."""
    blocks, h = gpt_blocks(L)
    prof = profile_layers(blocks[:3], h, repeats=1)
    return prof[1].act_bytes, prof[1].out_bytes, measured_gpt_peak(L, 1)


def _gpt_hint(rows, X: int) -> str:
    """Why a prediction misses: the measured peak minus the learner's, in units of X."""
    short = {(L, S): (measured - got) / X for L, S, got, measured in rows}
    worst = max(short, key=lambda k: abs(short[k]))
    L, S = worst
    side = "below" if short[worst] > 0 else "above"
    where = (f"At L = {L}, S = {S} yours is {abs(short[worst]):.1f} X {side} the measured step "
             "peak (X: the bytes a block passes on). ")
    if all(abs(abs(v) - 1) < 0.2 for v in short.values()):
        return where + ("One X off at every S: count the kept inputs again. The first segment's "
                        "input is the model's input, held by the caller.")
    if any(abs(v) > 0.2 for (L, S), v in short.items() if S == 1):
        return where + ("At S = 1 yours should give the plain step's peak itself. What the plain "
                        "step holds beyond L A is backward's working memory, and checkpointing "
                        "leaves it alone.")
    if all(abs(v) < 0.2 for (L, S), v in short.items() if L % S == 0):
        return where + ("Right where S divides L, wrong elsewhere: checkpoint_sequential gives "
                        "each segment L // S blocks and the last one all the rest.")
    return where + ("A checkpoint keeps its segment's input, X bytes, not the A bytes a block "
                    "keeps: a GPT block keeps about 18 X.")


def _gpt_step_peak(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('09.gpt_step_peak', "
                       "gpt_step_peak), a function (L, S, A, X, plain_peak) -> bytes.")
    rows = []
    for L, S in GPT_CASES:
        A, X, plain = gpt_pieces(L)
        try:
            got = answer(L, S, A, X, plain)
        except Exception as e:  # the learner's code: report, do not raise
            return False, (f"gpt_step_peak({L}, {S}, {A}, {X}, {plain}) raised "
                           f"{type(e).__name__}: {e}")
        if got is None:
            return False, ("not answered yet: gpt_step_peak returns None. Write its body: what "
                           "is alive when backward reaches the last segment (the hint above).")
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != got:
            return False, f"gpt_step_peak should return a number of bytes, got {got!r}."
        rows.append((L, S, got, measured_gpt_peak(L, S)))
    if any(abs(got / measured - 1) > GPT_TOLERANCE for _, _, got, measured in rows):
        return False, _gpt_hint(rows, gpt_pieces(GPT_CASES[0][0])[1])
    A, X, _ = gpt_pieces(12)
    return True, (f"Within {GPT_TOLERANCE:.0%} of torch's checkpoint_sequential at {len(rows)} "
                  f"depths and segment counts, where a block keeps {A / X:.0f} times what it "
                  "passes on. Article 1's (L - S)/L assumes the two are equal.")


EXERCISES = [
    Exercise("09.true_saving_100_10", "Article 2's model (one B x T x H tensor per layer), 100 "
             "layers, torch's checkpoint_sequential with 10 segments: what fraction of the step "
             "peak does it really save (a number between 0 and 1)?", _true_saving_100_10,
             expected=true_saving_100_10),
    Exercise("09.best_segments_transformer", "48 transformer blocks that each keep 18 units "
             "for backward and pass on 1 unit: which uniform segment count S gives the least "
             "step peak?", _best_segments_transformer, expected=best_segments_transformer),
    Exercise("09.accumulation_bound", "A model of 7e9 parameters (not Llama 2 7B's 6.74e9) "
             "trained with mixed-precision Adam (16 bytes per parameter) whose activations take "
             "60 GiB without checkpointing: by at most "
             "what factor can checkpointing plus accumulation lower its total peak (model state "
             "included)?",
             _accumulation_bound, expected=accumulation_bound),
    Exercise("09.gpt_step_peak", "Build task: pass your function gpt_step_peak(L, S, A, X, "
             "plain_peak), the step peak (activations) in bytes of L GPT blocks in S segments "
             "under checkpoint_sequential, from what one block keeps (A), what it passes on (X) "
             "and the step peak without checkpoints. It is checked against track_memory at "
             "several L and S.", _gpt_step_peak),
]
