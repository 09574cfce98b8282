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


FRAGMENTATION_SETTINGS = ("default", "expandable_segments")
RECORD = "record it with scripts/gpu_check.sh on a GPU"


def fragmentation() -> tuple[dict | None, str]:
    """The committed run's fragmentation check (`gpu_result("gpu_check")["fragmentation"]`) as
    {setting: its child's result} where both settings ran, and one line for the lesson to print:
    each setting's reserved/allocated peaks and what its capped run met, or why there is none."""
    run = load()
    if run is None:
        return None, f"no committed GPU run in this install; {RECORD}"
    frag = run.get("fragmentation")
    if frag is None:
        return None, (f"{label()} predates the fragmentation check: {RECORD} "
                      "(gpu_check.json's 'fragmentation')")
    runs = {s: frag[s] for s in FRAGMENTATION_SETTINGS if "whole_device" in frag.get(s, {})}
    if len(runs) < len(FRAGMENTATION_SETTINGS):
        why = frag.get("skipped") or "; ".join(str(frag.get(s, {}).get("error", "missing"))[:80]
                                               for s in FRAGMENTATION_SETTINGS if s not in runs)
        return None, f"{label()}: the fragmentation check did not run ({why}); {RECORD}"
    parts = []
    for setting, child in runs.items():
        whole, capped = child["whole_device"], child.get("capped", {})
        met = ("out of memory" if capped.get("oom") else f"all {len(capped.get('steps', []))} steps")
        parts.append(f"{setting}: peak reserved/allocated ×"
                     f"{whole['max_reserved_bytes'] / whole['max_allocated_bytes']:.2f}; capped, "
                     f"{capped.get('num_alloc_retries')} retries, {met}")
    return runs, f"{label()}: " + " · ".join(parts)
