"""Figures lessons 8 and 9 read from the committed GPU run (`committed.gpu_result`).

A CPU cannot show what depends on scale (step-time ratios at large sizes, the CUDA allocator's
cache), so these lessons put the H200 figures beside their own run, labelled "H200 (committed
run)", read from the file, never typed in. Where the files are absent (a pip install on Colab)
every function returns None and the lesson says so instead of citing.
"""
from __future__ import annotations

from ckpt_lab.lessons.committed import gpu_result


def load(name: str = "gpu_check") -> dict | None:
    """The committed result `name` (gpu_check, train) as a dict, or None where it is absent."""
    return gpu_result(name)


def label() -> str:
    """"H200 (committed run)": the committed run's device, as lessons label its figures."""
    run = load()
    device = run["device"].removeprefix("NVIDIA ") if run else "GPU"
    return f"{device} (committed run)"


def policy(name: str) -> dict | None:
    """One checkpoint policy's figures in the committed run (none, every, selective, ...)."""
    run = load()
    return None if run is None else run["policies"]["policies"].get(name)


def allocator_over_tracked() -> dict | None:
    """workload -> CUDA allocator peak / tracked tensor peak, from the committed run."""
    run = load()
    return None if run is None else {r["workload"]: r["allocator_over_tracked"]
                                     for r in run["tracker_vs_allocator"]}
