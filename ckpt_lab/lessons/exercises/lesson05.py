"""Exercises of lesson 5: Transformers and selective recomputation."""
from __future__ import annotations

from ckpt_lab import formulas

from .base import GIB, Exercise, _close


def _megatron_gib(answer):
    expected = formulas.megatron_layer_bytes(2048, 1, 12288, 96) / GIB
    return _close(answer, expected, 0.02,
                  "Too few: sbh(34 + 5as/h) bytes with s = 2048, b = 1, h = 12288, a = 96; "
                  "the 5as/h term is 80 here, more than the 34.",
                  "Too many: divide bytes by 2**30 for GiB; the formula already counts "
                  "16-bit activations (2 bytes each).")


def _crossover(answer):
    h, a = 768, 12
    expected = 34 * h / (5 * a)
    return _close(answer, expected, 0.03,
                  "Too short: set 5as/h = 34 and solve for s with h = 768, a = 12.",
                  "Too long: set 5as/h = 34 and solve for s with h = 768, a = 12.")


def _selective_fraction(answer):
    s, b, h, a = 2048, 1, 768, 12
    full = formulas.megatron_layer_bytes(s, b, h, a)
    expected = 1 - formulas.megatron_layer_bytes(s, b, h, a, selective=True) / full
    return _close(answer, expected, 0.02,
                  "Too small: selective recomputation drops the whole 5as/h part; compute "
                  "(5as/h) / (34 + 5as/h).",
                  "Too large: the 34 sbh of the projections and the MLP stay; give the "
                  "fraction (between 0 and 1) that is removed.")


EXERCISES = [
    Exercise("05.megatron_gib", "GPT-3 (s=2048, b=1, h=12288, a=96), 16-bit: GiB of "
             "activations per layer by Megatron's sbh(34 + 5as/h)?", _megatron_gib),
    Exercise("05.crossover_seq", "GPT-2 small (h=768, a=12): at what sequence length does the "
             "attention term 5as/h equal the 34?", _crossover),
    Exercise("05.selective_fraction", "GPT-2 small at s=2048: what fraction of a layer's "
             "activation bytes does selective recomputation remove?", _selective_fraction),
]
