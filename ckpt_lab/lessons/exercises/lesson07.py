"""Exercises of lesson 7: Combining techniques."""
from __future__ import annotations

import torch

from ckpt_lab import formulas

from .base import GIB, Exercise, _close


def _accumulation_peak(answer):
    def peak(batch):
        layers = formulas.gpt_layers(batch, 64, 4, 128, 4, 256, 4, True)
        spans = [(0, len(layers), False)]
        return formulas.chain_peak_bytes(layers, spans, batch * 64, 256, 4)
    expected = peak(2)
    return _close(answer, expected, 0.01,
                  "Too few: accumulation runs micro-batches of 8 // 4 = 2 rows one after the "
                  "other; the peak is that of one micro-batch of 2, not less.",
                  f"Too many: only one micro-batch's activations are alive at a time; compute "
                  f"formulas.chain_peak_bytes for batch 2 (the full batch of 8 peaks at "
                  f"{peak(8):,} bytes).")


def _offload_seconds(answer):
    from ckpt_lab.offload import PCIE4_X16_BYTES_PER_S, OffloadStats
    moved = 6 * GIB
    expected = OffloadStats(0, PCIE4_X16_BYTES_PER_S, bytes_offloaded=moved,
                            bytes_restored=moved).transfer_seconds
    return _close(answer, expected, 0.02,
                  "Too short: the bytes cross PCIe twice, to the host in forward and back in "
                  "backward; 6 GiB is 6 * 2**30 bytes.",
                  "Too long: 25 GB/s is 25e9 bytes per second; count each direction once.")


def accumulation_flops_ratio(micro_batches: int = 4) -> float:
    """Measured: FLOPs of a step split into `micro_batches` over FLOPs of the whole batch."""
    from torch.utils.flop_counter import FlopCounterMode

    from ckpt_lab.models import GPTConfig, build_model
    model = build_model(GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 16), generator=g)
    y = torch.randint(0, 256, (8, 16), generator=g)
    counts = []
    for k in (1, micro_batches):
        with FlopCounterMode(display=False) as fc:
            for xm, ym in zip(x.chunk(k), y.chunk(k)):
                (model(xm, ym) / k).backward()
        counts.append(fc.get_total_flops())
    return counts[1] / counts[0]


def _accumulation_flops(answer):
    expected = accumulation_flops_ratio(4)
    return _close(answer, expected, 0.01,
                  "Too small: every row of the batch still goes through the whole forward and "
                  "backward once.",
                  "Too large: accumulation recomputes nothing; it runs the same rows in four "
                  "smaller pieces.")


EXERCISES = [
    Exercise("07.accumulation_peak", "The gpt-cpu model (4 blocks, C=128, 4 heads, T=64, vocab "
             "256, dropout on, fp32), batch 8, no checkpointing, micro_batches=4: by the "
             "formula, how many bytes does the step peak at?", _accumulation_peak),
    Exercise("07.offload_seconds", "A step offloads 6 GiB of activations to the host and brings "
             "them back for backward: how many seconds of transfer at 25 GB/s (PCIe 4.0 x16)?",
             _offload_seconds),
    Exercise("07.accumulation_flops", "Splitting a step's batch into 4 micro-batches "
             "(accumulation): FLOPs of the step with accumulation divided by FLOPs without?",
             _accumulation_flops),
]
