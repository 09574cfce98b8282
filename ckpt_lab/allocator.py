"""What the allocator itself saw: every allocation and free, read from ``torch.profiler``.

`track_memory` counts tensor storages as ATen operations create them. The allocator also
serves what an operation allocates and frees inside itself (a convolution's workspace, a
softmax backward's temporary) and what runs below the dispatcher (compiled kernels, where a
dispatch mode cannot look: under one, ``torch.compile`` runs the module eagerly). The
profiler's memory events see all of it: `profiled_memory` replays them in time order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass
class ProfiledMemory:
    """Allocator bytes over a profiled block, relative to its start: the highest point and
    what was still allocated at its end (on one device type)."""

    peak_bytes: int
    end_bytes: int


def profiled_memory(fn, device: str = "cpu") -> ProfiledMemory:
    """Run ``fn()`` under ``torch.profiler`` (profile_memory=True) and replay the allocator's
    events for ``device`` ("cpu" or "cuda")."""
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
    want = torch.device(device).type
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and str(e.device_type()).split(".")[-1].lower() == want]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()
        peak = max(peak, current)
    return ProfiledMemory(peak, current)
