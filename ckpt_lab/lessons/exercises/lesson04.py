"""Exercises of lesson 4 (what recomputation costs, in FLOPs and in time).

Predictions: each right answer is measured when it is needed, FLOPs counted by PyTorch's
`FlopCounterMode` and time measured on the lesson's CPU-sized GPT. The opening asks for the
GPT with dropout, whose price can be reasoned (one more forward of every block, the head
excepted); the selective one comes after the lesson has taught early stop. Build task: the learner's
FLOP count of one transformer block, checked against `FlopCounterMode` on a real block at
several sizes.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.utils.checkpoint
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab.training.models import GPTConfig, build_model

from .base import Exercise, _number, near, one_of
from .threads import one_thread

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


@functools.lru_cache(maxsize=None)
def full_flops_ratio(dropout: float = 0.1) -> float:
    """Measured: FLOPs of a step with torch's checkpoint around every block over a plain one,
    for the lesson's GPT (dropout 0.1 unless told)."""
    model, idx = _gpt(dropout)
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
        return True, (f"x{expected:.3f}: a plain step costs about three forwards (backward "
                      "twice the forward), and backward re-runs every block's forward once "
                      "more. The head's matmul is never re-run, so the step comes to a little "
                      "under 4/3.")
    if value > expected:
        return False, (f"Measured x{expected:.3f}. Backward re-runs each block's forward once; "
                       "it does not repeat the backward. A step of about three forwards' FLOPs "
                       "becomes at most four.")
    return False, (f"Measured x{expected:.3f}. With dropout every block's forward runs again "
                   "in full, to redraw its masks. Backward costs about twice the forward, so "
                   "one more forward of every block adds about a third of a step, less the "
                   "head's share.")


@functools.lru_cache(maxsize=1)
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


# ------------------------------------------------------------------------ time and FLOPs
CORE_CHOICES = ("larger", "about the same", "smaller")


def core_time_over_flop_share(repeats: int = 5) -> float:
    """Measured: the attention cores' share of a plain step's time (their forward, timed by
    hooks) over their share of its FLOPs (counted), on the lesson's CPU GPT with dropout."""
    from ckpt_lab.measure.timing import forward_share
    model, idx = _gpt()
    plain = _flops(lambda: model(idx, idx).backward())
    cores = LAYERS * 4 * BATCH * SEQ ** 2 * HIDDEN          # Q K^T and . V, 2 B T^2 H each
    with one_thread():  # on a busy CPU a thread pool blurs the split
        time_share = forward_share(lambda: (model(idx, idx).backward(), model.zero_grad()),
                                   [b.attn.core for b in model.blocks()], repeats=repeats)
    return time_share / (cores / plain)


@functools.lru_cache(maxsize=1)
def core_time_share() -> str:
    """Measured: is the cores' share of the step's time larger than their share of its FLOPs
    (over 1.25 times), about the same, or smaller (under 0.8 times)?"""
    ratio = core_time_over_flop_share()
    return "larger" if ratio > 1.25 else "smaller" if ratio < 0.8 else "about the same"


_core_time = one_of(
    CORE_CHOICES, core_time_share, normalise=lambda a: a.strip().lower(),
    right="{expected}: FLOPs count only the two matmuls. The scaling, mask, softmax and dropout "
          "between them count 0 FLOPs, yet each reads and writes a B x n_h x T x T tensor, and "
          "small matmuls run below the machine's peak rate. Selective recomputation re-runs "
          "exactly those, so it costs more time than its FLOPs say.",
    hints={"about the same": "Measured: {expected}. Time follows FLOPs only where matmuls "
                             "dominate. The core's softmax, mask and dropout count 0 FLOPs but "
                             "still take time.",
           "smaller": "Measured: {expected}. FLOPs count the matmuls alone; the core's "
                      "element-wise work adds time that no FLOP count sees."},
    wrong="Measured: {expected}.")


# ------------------------------------------------------------------- the build task
# The learner writes the forward FLOPs of one transformer block as a function of its sizes; the
# judge counts a real Block with FlopCounterMode at several sizes, heads and MLP widths F.
BUILD_SIZES = ((2, 16, 32, 4, 128), (1, 24, 48, 3, 100), (3, 8, 64, 8, 256), (2, 40, 16, 2, 48))
NOT_ANSWERED = ("not answered yet (your function raises NotImplementedError or returns None): "
                "write its body, then run the cell again.")


def counted_block_flops(B: int, T: int, H: int, n_h: int, F: int) -> int:
    """FlopCounterMode's count of one forward of the lesson's transformer Block on B x T x H,
    with n_h heads and an MLP of inner width F (the GPT's is 4H)."""
    from torch import nn
    from ckpt_lab.training.models import Block
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=T, n_layer=1, n_head=n_h, n_embd=H, dropout=0.0))
    block.mlp.fc, block.mlp.proj = nn.Linear(H, F), nn.Linear(F, H)
    x = torch.randn(B, T, H)
    with torch.no_grad():
        return _flops(lambda: block(x))


def _judge_block_flops(fn):
    if not callable(fn):
        return False, "Pass your function itself: check(key, block_flops)."
    for B, T, H, n_h, F in BUILD_SIZES:
        try:
            mine = fn(B, T, H, F)
        except NotImplementedError:
            return False, NOT_ANSWERED
        except Exception as e:                        # the learner's code: say what it raised
            return False, f"block_flops({B}, {T}, {H}, {F}) raised {type(e).__name__}: {e}"
        if mine is None:
            return False, NOT_ANSWERED
        want = counted_block_flops(B, T, H, n_h, F)
        if mine == want:
            continue
        where = (f"At B, T, H, F = {B}, {T}, {H}, {F} ({n_h} heads) FlopCounterMode counts "
                 f"{want:,}; yours gives {mine:,}.")
        core, mlp = 4 * B * T ** 2 * H, 4 * B * T * H * F
        why = {3 * want: "That is a training step (forward and backward); count the forward.",
               want // 2: "A multiply and an add are 2 FLOPs: an (m x k)(k x n) matmul is 2mkn.",
               want - core: "The attention core's two matmuls are missing: Q K^T and . V, "
                            "2 B T^2 H each (n_h heads of T x H/n_h by H/n_h x T).",
               want - core // 2: "One of the attention core's two matmuls is missing.",
               want - mlp + 16 * B * T * H * H: "Your MLP is 4H wide: use F, the up projection "
                                               "is H x F and the down projection F x H."}
        return False, f"{where} {why.get(mine, 'Count the six matmuls of the picture, 2 FLOPs per multiply-add.')}"
    return True, ("Six matmuls: 6BTH^2 (Q, K, V), 2BT^2H (Q K^T), 2BT^2H (. V), 2BTH^2 (output), "
                  "2BTHF (up), 2BTFH (down); equal to FlopCounterMode at every size. The heads "
                  "cancel: n_h heads of (T x H/n_h)(H/n_h x T) cost 2BT^2H whatever n_h.")


EXERCISES = [
    Exercise("04.full_flops_dropout", "Full recomputation (torch's checkpoint around every "
             "block of the lesson's GPT, dropout 0.1): a step's FLOPs, as a multiple of a plain "
             "step's?", _full_flops, expected=full_flops_ratio),
    Exercise("04.selective_matmuls", "Selective recomputation checkpoints each attention core "
             "(Q K^T, mask, softmax, dropout, . V), and the recompute stops early. How many of "
             "the core's two matmuls does backward re-run: 0, 1 or 2?", _selective_matmuls, expected=selective_matmuls),
    Exercise("04.core_time_share", "The attention cores (Q K^T, scaling, mask, softmax, dropout, "
             ". V) do a few percent of a plain step's FLOPs. Is their share of the step's time "
             "'larger', 'about the same' or 'smaller' than their share of its FLOPs?",
             _core_time, expected=core_time_share),
    Exercise("04.block_flops", "Build task: write block_flops(B, T, H, F), the FLOPs of one "
             "forward of a transformer block (B sequences of T tokens, hidden size H, MLP inner "
             "width F), counted as FlopCounterMode counts them. Pass the function itself.",
             _judge_block_flops),
]
