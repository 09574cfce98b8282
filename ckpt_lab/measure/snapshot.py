"""Memory timelines in the format of PyTorch's memory visualizer (pytorch.org/memory_viz).

``torch.cuda.memory._record_memory_history`` + ``torch.cuda.memory._snapshot()`` record what
the CUDA caching allocator did: a dict with ``segments`` (the allocator's memory at the end,
as blocks) and ``device_traces`` (one list of events per device: ``alloc``,
``free_requested``, ``free_completed``, each with an address, a size and the frames that
asked for it). Pickled, that is the file the visualizer opens.

`record_allocations` writes the same format on any device, CPU included: it watches every
ATen operation as `track_memory` does (the same `memory.new_storages` rule, so the same
bytes: the tests hold the two to each other), gives each new storage a made-up address in
one growing segment, and labels it with the operation and the phase (forward, backward,
recompute). Addresses are invented, so fragmentation is not modelled; sizes and order are
exact. `cuda_snapshot` records the real thing on a GPU.
"""
from __future__ import annotations

import contextlib
import pickle
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .memory import current_phase, new_storages

ALIGN = 512     # the CUDA caching allocator rounds every block to 512 bytes


@dataclass
class AllocationTrace:
    """Events in `device_traces` form plus the allocations still alive (by address)."""

    events: list = field(default_factory=list)
    live: dict = field(default_factory=dict)
    next_addr: int = 0

    def live_bytes(self) -> list[int]:
        """Bytes allocated after each event: the curve the visualizer draws."""
        out, current = [], 0
        for e in self.events:
            if e["action"] == "alloc":
                current += e["size"]
            elif e["action"] == "free_completed":
                current -= e["size"]
            out.append(current)
        return out

    def peak_bytes(self) -> int:
        """The highest point of `live_bytes`."""
        return max(self.live_bytes(), default=0)

    def snapshot(self) -> dict:
        """The trace as a ``torch.cuda.memory._snapshot()`` dict (device 0, one segment)."""
        blocks, cursor = [], 0
        for addr in sorted(self.live):
            size, frames = self.live[addr]
            if addr > cursor:
                blocks.append({"address": cursor, "size": addr - cursor, "requested_size": 0,
                               "state": "inactive"})
            blocks.append({"address": addr, "size": size, "requested_size": size,
                           "state": "active_allocated", "frames": frames})
            cursor = addr + size
        total = max(self.next_addr, cursor)
        if total > cursor:
            blocks.append({"address": cursor, "size": total - cursor, "requested_size": 0,
                           "state": "inactive"})
        allocated = sum(size for size, _ in self.live.values())
        segment = {"device": 0, "address": 0, "total_size": total, "allocated_size": allocated,
                   "active_size": allocated, "requested_size": allocated, "stream": 0,
                   "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                   "frames": [], "blocks": blocks}
        return {"segments": [segment] if total else [], "device_traces": [list(self.events)],
                "allocator_settings": {}}


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: AllocationTrace):
        super().__init__()
        self.trace = trace
        self._lock = threading.Lock()
        self._refs: dict[int, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for st in new_storages(func, args, kwargs, out):
            if id(st) not in self._refs and st.nbytes() > 0:
                self._alloc(st, f"{func.__name__} [{current_phase()}]")
        return out

    def _event(self, action, addr, size, frames):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames,
                "time_us": time.perf_counter_ns() // 1000}

    def _alloc(self, st, label):
        size = st.nbytes()
        frames = [{"filename": "ckpt_lab", "line": 0, "name": label}]
        with self._lock:
            t = self.trace
            addr = t.next_addr
            t.next_addr += -(-size // ALIGN) * ALIGN
            t.live[addr] = (size, frames)
            t.events.append(self._event("alloc", addr, size, frames))
            key = id(st)
            self._refs[key] = (weakref.ref(st, self._freer(key, addr)),)

    def _freer(self, key, addr):
        def free(_):
            with self._lock:
                if self._refs.pop(key, None) is None:
                    return
                size, frames = self.trace.live.pop(addr)
                for action in ("free_requested", "free_completed"):
                    self.trace.events.append(self._event(action, addr, size, frames))
        return free

    def detach(self):
        with self._lock:
            self._refs.clear()


@contextlib.contextmanager
def record_allocations():
    """Record every storage created inside the block, and its free, as visualizer events:
    ``with record_allocations() as trace: ...; trace.snapshot()``."""
    trace = AllocationTrace()
    recorder = _Recorder(trace)
    try:
        with recorder:
            yield trace
    finally:
        recorder.detach()


def save_snapshot(snapshot: dict, path) -> None:
    """Write a snapshot dict as the pickle file pytorch.org/memory_viz opens."""
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


def cuda_snapshot(step, max_entries: int = 100_000) -> dict:
    """Run ``step()`` with CUDA memory history recording on and return the real snapshot."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_snapshot needs a CUDA device; use record_allocations on CPU")
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        step()
        torch.cuda.synchronize()
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def trace_peak_bytes(snapshot: dict, device: int = 0) -> int:
    """Peak of allocated bytes replayed from a snapshot's trace, relative to its start."""
    current = peak = 0
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            current += e["size"]
        elif e["action"] == "free_completed":
            current -= e["size"]
        peak = max(peak, current)
    return peak
