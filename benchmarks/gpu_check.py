"""The course's CUDA paths, measured on a GPU: one JSON for the lessons to cite.

Four measurements, each at the GPU sizes the lessons pick by themselves (`course.sizes`):

* tracker: per workload (the MLP, GPT per policy and ResNet presets), `track_memory`'s exact
  peak; ``track_memory(allocator=True)``'s `allocator_peak_bytes` (the allocator's own events,
  replayed) and the ops that held the most memory only while they ran; the CUDA caching
  allocator's `torch.cuda.max_memory_allocated` over the same step; and `memory_reserved`,
  what it holds from the driver (nvidia-smi shows that plus the CUDA context). The allocator
  rounds every block up (512 B minimum) and serves op temporaries and cuBLAS/cuDNN workspaces
  that no tensor owns, so it reads higher than the tracker; the table says by how much and why.
* offload: `offload_activations` with pinned host memory on a side stream: device peak with and
  without it, bytes moved, measured copy time and bandwidth, gradients against a plain run.
* fp16: `train(precision="fp16")` with its GradScaler beside fp32 and bf16: losses finite, the
  scale the scaler settled on, peaks and step times.
* policies: `benchmarks.bench_train` on the GPT at GPU size: step time, FLOPs and peak of each
  checkpoint policy (none, every block, segments of 2 blocks, selective, PyTorch's selective when
  the benchmark has it).
* throughput: `benchmarks.bench_throughput` at GPU size: tokens per second at equal global
  batch, checkpointing a larger micro-batch against accumulation, for two memory budgets.
* fragmentation (CUDA only): a training loop whose sequence length changes every step, once
  with the caching allocator's defaults and once with
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (each in its own process: the setting is
  read when CUDA initialises), first on the whole device, then capped a little above the
  step's peak: allocated and reserved bytes per step, the inactive split bytes (reserved
  memory cut into pieces too small to reuse), allocation retries and out-of-memory errors.

`scripts/gpu_check.sh` runs this, then every CUDA test and every lesson at GPU sizes, and folds
their pass/fail counts into the same JSON. On a machine without CUDA, `--quick` runs the same
code on the CPU at tiny sizes (the CUDA-only fields are null), so the logic is tested anywhere.
Run: python -m benchmarks.gpu_check [--quick] [--out PATH]
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ckpt_lab import track_memory
from ckpt_lab.training.data import ImageBatches, TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config
from ckpt_lab.checkpoint.offload import offload_activations
from ckpt_lab.training.loop import train

OUT = Path(__file__).parent / "results" / "gpu" / "gpu_check.json"


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _batch(cfg, batch: int, device: torch.device):
    """One (x, y) batch for a preset's config, on the device."""
    if hasattr(cfg, "image_size"):
        x, y = ImageBatches(batch, cfg.image_size, cfg.in_channels, cfg.num_classes).get(0)
    else:
        x, y = TextBatches(load_corpus(), batch, cfg.block_size, seed=0).get(0)
    return x.to(device), y.to(device)


def _cuda_statistics(device: torch.device, fn) -> dict:
    """The CUDA allocator's statistics over ``fn()`` from an emptied cache: the rise of
    max_memory_allocated above its level before, and reserved memory (None on CPU)."""
    if device.type != "cuda":
        fn()
        return {"max_memory_allocated_bytes": None, "allocated_before_bytes": None,
                "max_memory_reserved_bytes": None, "memory_reserved_bytes": None}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return {"max_memory_allocated_bytes": torch.cuda.max_memory_allocated() - start,
            "allocated_before_bytes": start,
            "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
            "memory_reserved_bytes": torch.cuda.memory_reserved()}


def _allocator_peak(device: torch.device, fn) -> int | None:
    """Bytes the CUDA allocator's max rose above its level before `fn()`; None on CPU."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def _step(model, x, y):
    model(x, y).backward()


def tracker_vs_allocator(device: torch.device, quick: bool) -> list[dict]:
    """track_memory's peak beside the allocator's, one forward + backward per workload: the
    allocator's statistics, then the tracker alone, then the tracker with allocator=True."""
    suffix = "tiny" if quick else ("gpu" if device.type == "cuda" else "cpu")
    workloads = [(f"mlp-{suffix}", "none", 8), (f"gpt-{suffix}", "none", 8),
                 (f"gpt-{suffix}", "every", 8), (f"gpt-{suffix}", "selective", 8),
                 (f"resnet-{suffix}", "none", 16), (f"resnet-{suffix}", "every", 16)]
    rows = []
    for preset, policy, batch in workloads:
        cfg = get_config(preset, **({"dropout": 0.0} if "gpt" in preset else {}))
        model = build_model(cfg, policy).to(device).train()
        x, y = _batch(cfg, batch, device)
        for p in model.parameters():         # parameter grads are state, allocated up front
            p.grad = torch.zeros_like(p)
        _step(model, x, y)                    # warm-up: cuBLAS handles, workspaces
        stats = _cuda_statistics(device, lambda: _step(model, x, y))
        with track_memory() as mem:
            _step(model, x, y)
        with track_memory(allocator=True) as seen:
            _step(model, x, y)
        here = f"cuda:{torch.cuda.current_device()}" if device.type == "cuda" else "cpu"
        allocator = seen.allocator_peak_bytes_by_device.get(here, 0)
        most = stats["max_memory_allocated_bytes"]
        rows.append({
            "workload": f"{preset} {policy}", "batch": batch,
            "tracked_peak_bytes": mem.peak_bytes,
            "tracked_peak_bytes_allocator_mode": seen.peak_bytes,   # must be the same
            "allocator_peak_bytes": allocator,                       # on this device
            "allocator_peak_bytes_all_devices": seen.allocator_peak_bytes,
            "tracked_with_transients_bytes": seen.peak_with_transients(),
            **stats,
            "allocator_peak_inside_tracker_bytes": mem.cuda_peak_bytes,
            "allocator_over_tracked": allocator / mem.peak_bytes,
            "max_memory_allocated_over_allocator_peak": most / allocator
            if most is not None and allocator else None,
            "top_transients": [{"op": p.op, "phase": p.phase, "step": p.step,
                                "bytes": p.transient_bytes} for p in seen.transients(3)],
            "at_allocator_peak": _split(seen.allocator_peak_point()),
            "allocator_end_bytes": seen.allocator_current_bytes,   # vs the tracker's end:
            "tracked_end_bytes": seen.current_bytes,               # what the step kept unseen
        })
        del model
    return rows


def _split(point) -> dict:
    """The allocator's peak, split: tracked storages, what the op held only while it ran,
    and what the allocator held beyond both (rounding, workspaces, memory made outside ops)."""
    return {"op": point.op, "phase": point.phase, "step": point.step,
            "tracked_bytes": point.live_bytes, "transient_bytes": point.transient_bytes,
            "untracked_bytes": point.allocator_bytes - point.live_bytes}


def offload_check(device: torch.device, quick: bool) -> dict:
    """Pinned-memory offload on the GPT: device peak, bytes and time moved, gradients equal."""
    preset = "gpt-tiny" if quick else ("gpt-gpu" if device.type == "cuda" else "gpt-cpu")
    cfg = get_config(preset, dropout=0.0)
    model = build_model(cfg, "none").to(device).train()
    x, y = _batch(cfg, 8, device)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)

    def grads():
        for p in params:
            p.grad.zero_()
        _step(model, x, y)
        return [p.grad.clone() for p in params]

    plain = grads()
    plain_again = grads()                        # is a plain step itself deterministic here?
    plain_peak = _allocator_peak(device, grads)
    for p in params:
        p.grad.zero_()
    with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
        loss = model(x, y)
    loss.backward()
    torch_offload = [p.grad.clone() for p in params]
    with track_memory() as plain_mem:
        grads()

    box = {}

    def offloaded():
        with offload_activations() as stats:
            for p in params:
                p.grad.zero_()
            loss = model(x, y)
        loss.backward()
        box["stats"], box["grads"] = stats, [p.grad.clone() for p in params]

    offloaded()                                  # warm-up: pinned buffers, the side stream
    _sync(device)
    start = time.perf_counter()
    off_peak = _allocator_peak(device, offloaded)
    seconds = time.perf_counter() - start
    stats = box["stats"]
    copy_seconds = stats.copy_seconds()
    moved = stats.bytes_offloaded + stats.bytes_restored
    with track_memory() as off_mem:
        offloaded()
    return {
        "preset": preset, "device": str(device),
        "plain_allocator_peak_bytes": plain_peak, "offload_allocator_peak_bytes": off_peak,
        "plain_tracked_peak_bytes": plain_mem.peak_bytes,
        "offload_tracked_peak_bytes": off_mem.peak_bytes,
        "bytes_offloaded": stats.bytes_offloaded, "bytes_restored": stats.bytes_restored,
        "copied_bytes": stats.copied_bytes, "storages": stats.storages,
        "copy_seconds": copy_seconds,
        "copy_bytes_per_s": moved / copy_seconds if copy_seconds else None,
        "step_seconds": seconds,
        "pinned": bool(device.type == "cuda"),
        "grads_equal": _same(plain, box["grads"]),
        "max_abs_grad_diff": _max_diff(plain, box["grads"]),
        "plain_repeat_grads_equal": _same(plain, plain_again),
        "torch_save_on_cpu_grads_equal": _same(plain, torch_offload),
        "torch_save_on_cpu_max_abs_grad_diff": _max_diff(plain, torch_offload),
    }


def _same(a: list, b: list) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b))


def _max_diff(a: list, b: list) -> float:
    return max(float((u - v).abs().max()) for u, v in zip(a, b))


def precision_check(device: torch.device, quick: bool) -> dict:
    """fp16 + GradScaler beside fp32 and bf16: a few steps of train() on the GPT."""
    preset = "gpt-tiny" if quick else ("gpt-gpu" if device.type == "cuda" else "gpt-cpu")
    cfg = get_config(preset)
    steps = 3 if quick else 8
    batches = TextBatches(load_corpus(), 8, cfg.block_size, seed=0)
    precisions = ["fp32", "bf16"] + (["fp16"] if device.type == "cuda" else [])
    out = {"preset": preset, "steps": steps}
    for precision in precisions:
        model = build_model(cfg, "every").to(device)
        result = train(model, batches, steps, precision=precision, device=device, seed=0,
                       progress=False)
        recs = result.records
        out[precision] = {
            "losses": result.losses,
            "all_finite": all(l == l and abs(l) != float("inf") for l in result.losses),
            "median_step_seconds": statistics.median(r.seconds for r in recs[1:]),
            "tracked_peak_bytes": max(r.peak_bytes for r in recs),
            "allocator_peak_bytes": max((r.cuda_peak_bytes or 0) for r in recs) or None,
            "grad_scale": result.scaler.get_scale() if result.scaler is not None else None,
        }
    return out


def policies_check(quick: bool, out_dir: Path) -> dict:
    """`benchmarks.bench_train` at the device's size, written beside this JSON."""
    from benchmarks import bench_train
    return bench_train.main(out_path=out_dir / "train.json", quick=quick)


def throughput_check(quick: bool, out_dir: Path) -> dict:
    """`benchmarks.bench_throughput` at the device's size, written beside this JSON."""
    from benchmarks import bench_throughput
    return bench_throughput.main(out_path=out_dir / "throughput.json", quick=quick)


# ------------------------------------------------------------------------- fragmentation
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ROOT = Path(__file__).resolve().parent.parent
ALLOCATOR_COUNTERS = {
    "allocated_peak_bytes": "allocated_bytes.all.peak",
    "reserved_peak_bytes": "reserved_bytes.all.peak",
    "inactive_split_peak_bytes": "inactive_split_bytes.all.peak",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "segments_peak": "segment.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "num_device_alloc": "num_device_alloc",
    "num_device_free": "num_device_free",
}


def allocator_stats(stats: dict) -> dict:
    """The counters of ``torch.cuda.memory_stats()`` that show fragmentation, renamed; a
    counter this PyTorch does not report is None."""
    return {name: stats.get(key) for name, key in ALLOCATOR_COUNTERS.items()}


def _fragmentation_phase(model, optimizer, x, y, lengths, cap_bytes=None) -> dict:
    """Train on `lengths` (one sequence length per step), reading the allocator each step."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    if cap_bytes is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(cap_bytes / total, 1.0))
    steps, error = [], None
    for T in lengths:
        try:
            model(x[:, :T], y[:, :T]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        except torch.OutOfMemoryError as e:
            error = str(e).splitlines()[0]
            optimizer.zero_grad(set_to_none=True)
            break
        torch.cuda.synchronize()
        steps.append({"seq": T, "allocated_bytes": torch.cuda.memory_allocated(),
                      "reserved_bytes": torch.cuda.memory_reserved()})
    out = {"cap_bytes": cap_bytes, "steps": steps, "completed": len(steps) == len(lengths),
           "oom": error, "max_allocated_bytes": torch.cuda.max_memory_allocated(),
           "max_reserved_bytes": torch.cuda.max_memory_reserved(),
           **allocator_stats(torch.cuda.memory_stats())}
    torch.cuda.set_per_process_memory_fraction(1.0)
    return out


def fragmentation_child(quick: bool) -> dict:
    """What one process measures (its allocator setting came with its environment)."""
    out = {"alloc_conf": os.environ.get(ALLOC_CONF), "cuda": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        return {**out, "skipped": "no CUDA device: the caching allocator is CUDA's"}
    preset = "gpt-tiny" if quick else "gpt-gpu"
    cfg = get_config(preset, dropout=0.0)
    full = cfg.block_size
    lengths = [full // 4, full, full * 3 // 8, full * 7 // 8, full // 2, full * 3 // 4,
               full * 5 // 8, full]
    torch.manual_seed(0)
    model = build_model(cfg, "none").cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = TextBatches(load_corpus(), 8, full, seed=0).get(0)
    x, y = x.cuda(), y.cuda()
    start = time.perf_counter()
    whole = _fragmentation_phase(model, optimizer, x, y, lengths)
    cap = int(1.10 * whole["max_allocated_bytes"])
    capped = _fragmentation_phase(model, optimizer, x, y, lengths, cap_bytes=cap)
    return {**out, "preset": preset, "batch": 8, "lengths": lengths, "whole_device": whole,
            "capped": capped, "seconds": time.perf_counter() - start}


def run_child(alloc_conf: str | None, quick: bool, timeout: float = 180) -> dict:
    """`fragmentation_child` in a fresh process whose environment sets (or unsets)
    PYTORCH_CUDA_ALLOC_CONF, so the allocator reads it when CUDA initialises."""
    env = {k: v for k, v in os.environ.items() if k != ALLOC_CONF}
    if alloc_conf is not None:
        env[ALLOC_CONF] = alloc_conf
    args = [sys.executable, "-m", "benchmarks.gpu_check", "--fragmentation-child"]
    run = subprocess.run(args + (["--quick"] if quick else []), cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        return {"error": f"exit {run.returncode}: {run.stderr.strip()[-800:]}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def fragmentation_check(device: torch.device, quick: bool) -> dict:
    """Default allocator against expandable segments, each in its own process (CUDA only)."""
    if device.type != "cuda":
        return {"skipped": "CUDA only: torch.cuda.memory_reserved() and memory_stats() describe "
                           "the CUDA caching allocator; a CPU has no caching allocator in "
                           "PyTorch (see docs/recipes.md for what to read there instead)"}
    torch.cuda.empty_cache()      # this process's cache is not the children's to compete with
    return {"default": run_child(None, quick),
            "expandable_segments": run_child("expandable_segments:True", quick)}


def main(out_path: Path | None = None, quick: bool = False) -> dict:
    """Run every measurement, write one JSON, return it."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    out = Path(out_path) if out_path is not None else OUT
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
        or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "quick": quick,
    }
    for name, fn in [("tracker_vs_allocator", lambda: tracker_vs_allocator(device, quick)),
                     ("offload", lambda: offload_check(device, quick)),
                     ("precision", lambda: precision_check(device, quick)),
                     ("policies", lambda: policies_check(quick, out.parent)),
                     ("throughput", lambda: throughput_check(quick, out.parent)),
                     ("fragmentation", lambda: fragmentation_check(device, quick))]:
        start = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as e:                  # one failing part must not hide the others
            result[name] = {"error": f"{type(e).__name__}: {e}"}
        seconds = time.perf_counter() - start
        result.setdefault("section_seconds", {})[name] = round(seconds, 1)
        print(f"{name}: {seconds:.1f} s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--fragmentation-child" in args:
        print(json.dumps(fragmentation_child(quick="--quick" in args)))
    else:
        path = Path(args[args.index("--out") + 1]) if "--out" in args else None
        main(path, quick="--quick" in args)
