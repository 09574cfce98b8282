"""Exercises of lesson 12: Scale out."""
from __future__ import annotations

from .base import GIB, Exercise, _close, _number


def _fsdp_state_gib(answer):
    from ckpt_lab.parallel_formulas import fsdp_state_bytes
    expected = fsdp_state_bytes([1_300_000_000], 8) / GIB
    return _close(answer, expected, 0.02,
                  "Too few: FSDP shards the fp32 weights, their gradients and Adam's two "
                  "moments, 16 bytes per parameter in all; divide by the 8 ranks, then by 2**30.",
                  "Too many: every part of the state is sharded, so each rank keeps 16/8 = 2 "
                  "bytes per parameter (DDP's buckets are gone: FSDP reduce-scatters instead).")


def _stage_in_flight(answer):
    from ckpt_lab.lessons.scale_out import schedule
    held, expected = 0, 0               # walk the schedule `pipeline_step` runs
    for op, _ in schedule("1f1b", 4, 1, 8):
        held += 1 if op == "F" else -1
        expected = max(expected, held)
    value = _number(answer)
    if value == expected:
        return True, (f"{expected}: stage 1 runs {4 - 1 - 1} warm-up forwards, then one more "
                      "before its first backward; the micro-batch count does not matter.")
    return False, ("Under 1F1B stage r runs stages - r - 1 forwards before it starts to "
                   "alternate, and one more forward before each backward: count what it holds "
                   "when its first backward begins (GPipe would hold all 8).")


def _sp_over_tp(answer):
    from ckpt_lab.parallel_formulas import megatron_tp_layer_bytes
    s, h, a, t = 2048, 12288, 96, 8
    expected = megatron_tp_layer_bytes(s, 1, h, a, t, True) / megatron_tp_layer_bytes(s, 1, h, a, t)
    return _close(answer, expected, 0.01,
                  "Too small: sequence parallelism divides only the 10 sbh that tensor "
                  "parallelism leaves whole; the 24 sbh and 5as^2b were split by t already.",
                  "Too large: with sequence parallelism the layer norms' inputs and the dropout "
                  "masks are split by t too: (34 + 5as/h)/t against 10 + 24/t + 5as/(ht).")


EXERCISES = [
    Exercise("12.fsdp_state_gib", "A 1.3B-parameter model with fp32 weights and Adam, trained "
             "on 8 ranks with FSDP (ZeRO-3): GiB of model state (weights, gradients, Adam's "
             "moments) per rank?", _fsdp_state_gib),
    Exercise("12.stage_in_flight", "4 pipeline stages, 8 micro-batches, 1F1B schedule: for how "
             "many micro-batches does stage 1 (the second stage) hold activations at its peak?",
             _stage_in_flight),
    Exercise("12.sp_over_tp", "One Megatron layer, s=2048, b=1, h=12288, a=96, t=8: per-GPU "
             "activation bytes with tensor + sequence parallelism divided by those with tensor "
             "parallelism alone?", _sp_over_tp),
]
