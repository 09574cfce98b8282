"""Throughput at equal global batch: checkpointing a larger micro-batch against accumulation.

For the course's GPT at a fixed global batch (rows, hence tokens, per optimizer step) and a
memory budget, `ckpt_lab.training.throughput.budget_setups` picks the setups that fit: no checkpoint at
the largest micro-batch that fits (with accumulation up to the global batch) and at a smaller
one, full checkpointing at the largest micro-batch it allows and at no checkpoint's,
selective recomputation at its largest, and for reference no checkpoint at checkpointing's
micro-batch (over the budget). `measure_throughput` trains each for the same steps
(`ckpt_lab.train`, AdamW) and reports tokens per second (median), the step's exact peak
(`track_memory`, one micro-batch's forward + backward, parameter gradients allocated
beforehand), FLOPs per step and whether it fits.

Two budgets per model: "roomy" (no checkpoint fits a quarter of the global batch) and
"tight" (no checkpoint fits one row). The reading per budget (`reading`): the fastest setup
that fits; what checkpointing's larger micro-batch M buys by itself (no checkpoint at M over
no checkpoint at the m that fits) and what the recompute costs at M (no checkpoint at M over
full checkpointing at M). Checkpointing wins when the gain outweighs the cost.

On a CPU, times are this process's CPU time with torch on one thread (the box is shared);
on CUDA, wall time between synchronisations. The JSON names the machine (`machine`: CPU model,
cores, torch, the load when the run began) and carries the run's `notes`.
Run: python -m benchmarks.bench_throughput [--quick]  (writes benchmarks/results/throughput.json)
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks import machine
from benchmarks.bench_losses import threads_set
from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config
from ckpt_lab.training.throughput import budget_setups, measure_throughput, step_peak_bytes

OUT = Path(__file__).parent / "results" / "throughput.json"
REPEATS = 7          # timed rounds per setup (median): enough to steady a shared machine's noise


def _cases(quick: bool, device: str) -> list[dict]:
    """(model config, global batch, budgets as no checkpoint's largest micro-batch)."""
    if quick:
        return [dict(name="gpt-tiny", config=get_config("gpt-tiny"), global_batch=8,
                     budgets={"roomy": 2, "tight": 1})]
    if device == "cuda":
        return [dict(name="gpt-gpu", config=get_config("gpt-gpu"), global_batch=16,
                     budgets={"roomy": 4, "tight": 1})]
    # lesson 7's GPT at its CPU sizes (dropout off), so its run and this one are one experiment
    return [dict(name="gpt-cpu", config=get_config("gpt-cpu", dropout=0.0), global_batch=16,
                 budgets={"roomy": 4, "tight": 1}),
            dict(name="gpt-cpu, 8 layers", config=get_config("gpt-cpu", n_layer=8, dropout=0.0),
                 global_batch=16, budgets={"tight": 1})]


def _speed(rows, policy, micro_batch) -> float | None:
    """tokens/s of the row with this policy and micro-batch, if measured."""
    return next((r["tokens_per_s"] for r in rows
                 if r["policy"] == policy and r["micro_batch"] == micro_batch), None)


def reading(rows: list[dict]) -> dict:
    """The fastest setup that fits, and why: with m the largest micro-batch no checkpoint fits
    and M full checkpointing's, checkpointing (at M) against no checkpoint (at m) is
    what M buys over m without checkpointing, divided by what the recompute costs at M."""
    fitting = [r for r in rows if r["fits"] is not False]
    fastest = max(fitting, key=lambda r: r["tokens_per_s"])
    m = max((r["micro_batch"] for r in fitting if r["policy"] == "none"), default=None)
    M = max((r["micro_batch"] for r in fitting if r["policy"] == "every"), default=None)
    plain_m, plain_M, every_M = _speed(rows, "none", m), _speed(rows, "none", M), \
        _speed(rows, "every", M)
    gain = plain_M / plain_m if plain_m and plain_M else None
    cost = plain_M / every_M if plain_M and every_M else None
    return {
        "fastest": fastest["label"],
        "checkpointing_wins": fastest["policy"] != "none",
        "plain_micro_batch": m, "checkpointed_micro_batch": M,
        "checkpointed_over_plain": every_M / plain_m if every_M and plain_m else None,
        "larger_micro_batch_gain": gain,
        "recompute_cost": cost,
    }


def main(out_path: Path | None = None, quick: bool = False, threads: int | None = 1,
         repeats: int | None = None) -> dict:
    """Measure every case and budget, write JSON, return it (threads: torch's CPU threads
    while it runs; 1 by default, steadier on a shared machine)."""
    with threads_set(threads if not torch.cuda.is_available() else None):
        return _main(out_path, quick, repeats)


def _main(out_path, quick: bool, repeats: int | None) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    described = machine.describe()               # the load before the run, not after it
    repeats = repeats if repeats is not None else (1 if quick else REPEATS)
    clock = "wall" if device == "cuda" else "cpu"
    cases = []
    for case in _cases(quick, device):
        cfg, G = case["config"], case["global_batch"]
        batches = TextBatches(load_corpus(), G, cfg.block_size, seed=0)
        model = build_model(cfg).to(device)
        x, y = (t.to(device) for t in batches.get(0))
        for budget_name, micro in case["budgets"].items():
            start = time.perf_counter()
            budget = step_peak_bytes(model, x, y, "none", micro)
            setups = budget_setups(model, x, y, budget, reference=True)
            rows = [asdict(r) for r in measure_throughput(
                model, batches, setups, budget, repeats=repeats, warmup=1, device=device,
                clock=clock)]
            cases.append({
                "model": case["name"], "config": asdict(cfg), "budget": budget_name,
                "budget_bytes": budget, "budget_is": f"no checkpoint's peak at micro-batch {micro}",
                "global_batch": G, "tokens_per_step": G * cfg.block_size, "rows": rows,
                "reading": reading(rows), "seconds": time.perf_counter() - start})
        del model
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "machine": described, "notes": machine.notes(),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": repeats,
        "clock": ("wall time between CUDA synchronisations" if clock == "wall" else
                  "process CPU time around each optimizer step, torch on "
                  f"{torch.get_num_threads()} thread(s)"),
        "peak": "track_memory's exact peak of one micro-batch's forward + backward, parameter "
                "gradients allocated beforehand (model state: not part of the budget)",
        "flops": "FlopCounterMode, forward + backward of the whole step, recompute included",
        "cases": cases,
    }
    out = Path(out_path) if out_path is not None else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for c in cases:
        print(f"{c['model']}, {c['budget']} budget ({c['budget_bytes'] / 2**20:.1f} MiB), "
              f"{c['tokens_per_step']} tokens per step:")
        for r in c["rows"]:
            print(f"  {r['label']:58s} micro-batch {r['micro_batch']:3d} x{r['accumulation']:<3d}"
                  f" {r['tokens_per_s']:9.0f} tok/s  peak {r['peak_bytes'] / 2**20:8.1f} MiB"
                  f"  {r['step_flops'] / 1e9:8.1f} GFLOP")
        print(f"  -> {c['reading']}")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
