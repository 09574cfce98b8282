"""The course's committed GPU runs (``benchmarks/results/gpu/*.json``), read where they exist.

A lesson that makes a point depending on scale (a time ratio, GiB) shows the H200 figures
from these files beside its own CPU run, labelled "H200 (committed run)" (`label`), instead of
typing them in. They sit in a checkout of the repository, not in the wheel: on Colab without a
clone every reader returns None and the lesson shows its own run only.
"""
from __future__ import annotations

import json
from pathlib import Path

from ckpt_lab.lessons.units import fmt_bytes

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu"
CPU_RESULTS = RESULTS.parent          # `make bench`'s runs, committed from a CPU machine


def gpu_result(name: str) -> dict | None:
    """The committed GPU run ``benchmarks/results/gpu/<name>.json``, or None where it is absent."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def cpu_result(name: str) -> dict | None:
    """The committed CPU run ``benchmarks/results/<name>.json`` (`make bench`), or None."""
    path = CPU_RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def machine_label(run: dict) -> str:
    """How a figure names the machine of a committed run: "AMD EPYC, 2 cores (committed run)"
    from its ``machine`` field, the GPU's last word for a GPU run ("H200 (committed run)"), the
    ``device`` field for a run written before the machine was recorded."""
    machine = run.get("machine") or {}
    if machine.get("gpu") or not machine:
        name = (machine.get("gpu") or run.get("device") or "GPU").split()[-1]
    else:
        name = f"{machine['cpu']}, {machine['cores']} cores"
    return f"{name} (committed run)"


def full_recompute_ratios(run: dict) -> dict[str, float]:
    """Peak, FLOPs and time of checkpointing every block over none, from a ``train`` run."""
    every = run["policies"]["every"]
    return {"peak": every["peak_ratio"], "FLOPs": every["flop_ratio"], "time": every["time_ratio"]}


def label(name: str = "gpu_check") -> str:
    """How a figure names the committed run: "H200 (committed run)"."""
    found = gpu_result(name)
    device = (found or {}).get("device", "GPU")
    return f"{device.split()[-1]} (committed run)"


def policies() -> dict | None:
    """Per checkpoint policy of the committed GPT run (gpu_check): {"FLOPs", "time", "peak"}
    ratios to the plain step, plus "config" (the GPT's sizes) and "batch"; None without it."""
    found = gpu_result("gpu_check")
    if found is None or "policies" not in found:
        return None
    block = found["policies"]
    out = {name: {"FLOPs": r["flop_ratio"], "time": r["time_ratio"], "peak": r["peak_ratio"]}
           for name, r in block["policies"].items()}
    out["config"], out["batch"] = block["config"], block["batch_size"]
    return out


def section(key: str) -> dict | None:
    """One top-level section of the committed gpu_check run ("offload", "precision", ...)."""
    found = gpu_result("gpu_check")
    return None if found is None else found.get(key)


# ------------------------------------------------------------------ lesson 1: allocator bytes
def tracker_vs_allocator(run: dict) -> dict[str, dict]:
    """``gpu_check``'s tracker-vs-allocator rows by workload, in one shape whatever the run's
    age: `tensor_peak` (track_memory's), `max_allocated` (the rise of
    ``torch.cuda.max_memory_allocated`` over the same step), and `events` True where the run
    also has track_memory(allocator=True)'s own peak (`allocator_peak`), the op at that peak
    (`at_peak`), and the process's `allocated` and `reserved` bytes at their peaks; older runs
    have None there."""
    rows = {}
    for r in run["tracker_vs_allocator"]:
        events = "max_memory_allocated_bytes" in r
        before, most = r.get("allocated_before_bytes"), r.get("max_memory_allocated_bytes")
        rows[r["workload"]] = {
            "batch": r["batch"], "tensor_peak": r["tracked_peak_bytes"], "events": events,
            # runs before track_memory(allocator=True) stored max_memory_allocated's rise here
            "max_allocated": most if events else r["allocator_peak_bytes"],
            "allocator_peak": r["allocator_peak_bytes"] if events else None,
            "at_peak": r["at_allocator_peak"]["op"].split(".")[0] if events else None,
            "allocated": before + most if events and None not in (before, most) else None,
            "reserved": r.get("max_memory_reserved_bytes"),
        }
    return rows


def allocator_lines(run: dict, workloads=("mlp-gpu none", "gpt-gpu none", "resnet-gpu none")
                    ) -> list[str]:
    """Lesson 1's table of a committed GPU run: per workload, tensor bytes against allocator
    bytes, and reserved bytes where the run has them; else max_memory_allocated alone, said so."""
    rows = tracker_vs_allocator(run)
    rows = {w: rows[w] for w in workloads if w in rows}
    where = f"{run['device']} (committed run, torch {run['torch']})"

    def show(n):
        return "n/a" if n is None else fmt_bytes(n)

    def over(a, b):
        return "" if None in (a, b) else f" ({a / b - 1:+.1%})"

    if all(r["events"] for r in rows.values()):
        lines = [f"{where}, one forward + backward, tensor bytes -> allocator bytes "
                 "(its events; max_memory_allocated), then the process's peaks:"]
        lines += [f"  {w}, batch {r['batch']}: {show(r['tensor_peak'])} -> "
                  f"{show(r['allocator_peak'])}{over(r['allocator_peak'], r['tensor_peak'])}; "
                  f"{show(r['max_allocated'])}, peak in {r['at_peak']}; process "
                  f"{show(r['allocated'])} allocated, {show(r['reserved'])} reserved"
                  for w, r in rows.items()]
        return lines
    lines = [f"{where}, one forward + backward, tensor peak -> torch.cuda.max_memory_allocated "
             "(this run recorded no per-op temporaries or reserved bytes):"]
    lines += [f"  {w}, batch {r['batch']}: tensor peak {show(r['tensor_peak'])} -> "
              f"max_memory_allocated {show(r['max_allocated'])}"
              f"{over(r['max_allocated'], r['tensor_peak'])}" for w, r in rows.items()]
    return lines


# ---------------------------------------------------- lesson 7: throughput at equal global batch
def throughput() -> dict | None:
    """The committed GPU run of `benchmarks.bench_throughput` (gpu_check's "throughput" section,
    or ``gpu/throughput.json`` beside it); None where neither has one."""
    found = section("throughput") or gpu_result("throughput")
    return found if found and found.get("cases") else None


def cpu_throughput() -> dict | None:
    """The committed CPU run of `benchmarks.bench_throughput` (throughput.json), or None."""
    found = cpu_result("throughput")
    return found if found and found.get("cases") and found.get("device") == "cpu" else None


def throughput_panels(run: dict | None = None, model: str | None = None) -> dict | None:
    """The committed throughput run as `plots.throughput_panels` takes it: one panel per model
    (only ``model`` where given) and budget, titled "<machine_label>, <model>, <budget> budget",
    holding (budget bytes, rows); None without a run (by default the committed GPU run)."""
    run = run if run is not None else throughput()
    if run is None:
        return None
    where = machine_label(run)
    return {f"{where}, {c['model']}, {c['budget']} budget": (c["budget_bytes"], c["rows"])
            for c in run["cases"] if model in (None, c["model"])}
