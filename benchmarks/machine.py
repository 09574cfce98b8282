"""Which machine a benchmark ran on, written into its JSON so a committed result names its source.

`describe` gives the CPU's model, its cores, torch's version and threads, the GPU's name where
there is one, and the load average when the run started: on a machine shared with other
programs, timings are noisier, and the load says how shared it was. `notes` is the free text a
person running the benchmarks adds (`python -m benchmarks.run_all --notes "..."`), read from
the environment variable NOTES_VARIABLE so every benchmark of one run carries it.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

NOTES_VARIABLE = "CKPT_LAB_BENCH_NOTES"


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo's on Linux, else what `platform` reports."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe() -> dict:
    """The machine this process runs on, and how busy it is now (load average over 1 minute)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "os": platform.platform(),
        "load_average_1min": None if load is None else round(load, 2),
    }


def notes() -> str | None:
    """The notes given for this run of the benchmarks (NOTES_VARIABLE), or None."""
    return os.environ.get(NOTES_VARIABLE) or None
