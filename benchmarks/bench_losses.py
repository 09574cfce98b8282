"""The loss at large vocabularies: the logits' share of a GPT step, and chunked cross-entropy.

For the course's GPT (gpt-cpu: 4 blocks, C = 128, T = 64) at vocabularies of 256, 32K and
128K, one forward + backward with the plain loss and with `ckpt_lab.chunked_cross_entropy` in
2 and 8 chunks (`ckpt_lab.lessons.large_vocab.vocab_sweep`): the exact peak from
`track_memory`, where it sits, the logits' share of it, the chunked peaks beside the formula
(the model's other activations plus `formulas.chunked_cross_entropy_peak_bytes`), and the
untracked step times. The JSON names the machine (`machine`) and carries the run's `notes`.
Run: python -m benchmarks.bench_losses [--quick]  (writes benchmarks/results/losses.json)
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

from benchmarks import machine
from ckpt_lab.lessons.large_vocab import vocab_sweep

OUT = Path(__file__).parent / "results" / "losses.json"


@contextlib.contextmanager
def threads_set(n: int | None):
    """torch on ``n`` threads inside the block (None: unchanged), the old count put back after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def main(out_path: Path | None = None, quick: bool = False, threads: int | None = 1) -> dict:
    """Run the sweep, write JSON, return it. threads=1: steadier times on a shared CPU."""
    with threads_set(threads if not torch.cuda.is_available() else None):
        return _main(out_path, quick)


def _main(out_path, quick: bool) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    described = machine.describe()               # the load before the run, not after it
    if quick:
        kwargs = dict(vocab_sizes=(256, 4096), batch=8, chunks=(2, 4), preset="gpt-tiny",
                      repeats=1)
    else:
        kwargs = dict(vocab_sizes=(256, 32768, 131072), batch=4, chunks=(2, 8),
                      preset="gpt-cpu", repeats=7)   # a median of 7 steadies a shared machine
    rows = vocab_sweep(device=device, **kwargs)
    result = {"device": device, "machine": described, "notes": machine.notes(),
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "preset": kwargs["preset"], "batch": kwargs["batch"],
              "timed": "forward + backward, parameter gradients allocated beforehand; "
                       "median of untracked repeats",
              "vocab": rows}
    out = Path(out_path) if out_path is not None else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        share = f"{r['logits_share']:.0%}" if r["logits_share"] is not None else "-"
        print(f"V={r['vocab']:>6}: plain peak {r['plain']['peak_bytes'] / 2**20:7.1f} MiB at "
              f"{r['plain']['peak_op']}, loss share {share}")
        for k, c in r["chunked"].items():
            print(f"   {k:>3} chunks: {c['peak_bytes'] / 2**20:7.1f} MiB (saves {c['saved']:.0%}) "
                  f"at {c['peak_op']}, time x{c['time_ratio']:.2f}")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
