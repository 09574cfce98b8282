"""The course's committed GPU run (benchmarks/results/gpu/*.json), read for lessons that cite it.

A CPU cannot show what depends on scale (time ratios at large sizes, the CUDA allocator's
cache), so lessons put the H200 figures beside their own run, labelled "H200 (committed run)",
read from the file, never typed in. The files live in the repository, not in the installed
package: where they are absent (a pip install on Colab) `load` returns None and the lesson says
so instead of citing.
"""
from __future__ import annotations

import json
from pathlib import Path

import ckpt_lab

RESULTS = Path(ckpt_lab.__file__).resolve().parent.parent / "benchmarks" / "results" / "gpu"


def load(name: str = "gpu_check") -> dict | None:
    """The committed result `name` (gpu_check, train) as a dict, or None where it is absent."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


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
