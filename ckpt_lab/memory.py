"""Exact memory measurement for any device, CPU included.

`track_memory` watches every ATen operation through a `TorchDispatchMode`, registers each
tensor *storage* an operation creates (views share a storage, so they are counted once) and
holds a weak reference to it, so the moment autograd or Python drops the last reference the
bytes leave the books. The numbers are therefore a property of the program, not of an
allocator: identical on a laptop, on Binder and on a GPU. On CUDA the allocator's own peak is
recorded beside them for comparison.
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_local = threading.local()


class SimulatedOutOfMemoryError(torch.OutOfMemoryError):
    """Raised by `track_memory(limit_bytes=...)`: a pretend GPU of that size ran out."""

    def __init__(self, live_bytes: int, limit_bytes: int, op: str):
        self.live_bytes, self.limit_bytes, self.op = live_bytes, limit_bytes, op
        super().__init__(
            f"simulated out of memory in {op}: {live_bytes:,} bytes live > limit of "
            f"{limit_bytes:,} bytes. Checkpoint more densely, use a smaller micro-batch, "
            "or raise limit_bytes."
        )


@contextlib.contextmanager
def phase(name: str):
    """Label the operations run inside this block (e.g. "recompute", "optimizer") in timelines."""
    stack = _phase_stack()
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def _phase_stack() -> list:
    if not hasattr(_local, "phases"):
        _local.phases = []
    return _local.phases


def current_phase() -> str:
    """The phase label the next operation would get: forward, backward, or a `phase` label."""
    stack = _phase_stack()
    if stack:
        return stack[-1]
    return "backward" if torch._C._current_autograd_node() is not None else "forward"


@dataclass
class TimelinePoint:
    """Live bytes right after one operation."""

    step: int
    live_bytes: int
    phase: str
    op: str


@dataclass
class MemoryLog:
    """What `track_memory` saw. Bytes are those of storages allocated inside the block."""

    limit_bytes: int | None = None
    peak_bytes: int = 0
    current_bytes: int = 0
    allocated_bytes: int = 0
    num_ops: int = 0
    timeline: list[TimelinePoint] = field(default_factory=list)
    peak_bytes_by_device: dict[str, int] = field(default_factory=dict)
    current_bytes_by_device: dict[str, int] = field(default_factory=dict)
    cuda_peak_bytes: int | None = None
    seconds: float = 0.0

    def phase_peaks(self) -> dict[str, int]:
        """The highest live bytes seen after an operation of each phase."""
        out: dict[str, int] = {}
        for p in self.timeline:
            out[p.phase] = max(out.get(p.phase, 0), p.live_bytes)
        return out


class _Tracker(TorchDispatchMode):
    """Registers new storages created by each op and forgets them when they are freed."""

    def __init__(self, log: MemoryLog):
        super().__init__()
        self.log = log
        self._refs: dict[int, tuple[weakref.ref, int, str]] = {}
        self._lock = threading.RLock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out):
        log = self.log
        new = [(id(st), st) for st in new_storages(func, args, kwargs, out)
               if id(st) not in self._refs and st.nbytes() > 0]
        with self._lock:
            for key, st in new:
                nbytes, dev = st.nbytes(), str(st.device)
                self._refs[key] = (weakref.ref(st, self._freer(key)), nbytes, dev)
                log.current_bytes += nbytes
                log.allocated_bytes += nbytes
                by = log.current_bytes_by_device
                by[dev] = by.get(dev, 0) + nbytes
                log.peak_bytes_by_device[dev] = max(log.peak_bytes_by_device.get(dev, 0), by[dev])
            log.peak_bytes = max(log.peak_bytes, log.current_bytes)
            log.num_ops += 1
            log.timeline.append(TimelinePoint(log.num_ops, log.current_bytes, current_phase(),
                                              func.__name__))
            live = log.current_bytes
        if new and log.limit_bytes is not None and live > log.limit_bytes:
            raise SimulatedOutOfMemoryError(live, log.limit_bytes, func.__name__)

    def _freer(self, key: int):
        def free(_ref):
            with self._lock:
                entry = self._refs.pop(key, None)
                if entry is not None:
                    _, nbytes, dev = entry
                    self.log.current_bytes -= nbytes
                    self.log.current_bytes_by_device[dev] -= nbytes
        return free

    def detach(self):
        """Stop listening for frees (the block is over; the log keeps its final numbers)."""
        with self._lock:
            self._refs.clear()


_ALIASES: dict = {}


def _aliases(func) -> bool:
    """Whether an op's outputs may share storage with its inputs (views, in-place, out=)."""
    hit = _ALIASES.get(func)
    if hit is None:
        hit = _ALIASES[func] = any(r.alias_info is not None for r in func._schema.returns)
    return hit


def _tensors(tree):
    """The dense tensors with real storage in nested tuples/lists/dicts (op args are shallow)."""
    if isinstance(tree, torch.Tensor):
        if tree.layout == torch.strided and tree.device.type != "meta":
            yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


def new_storages(func, args, kwargs, out) -> list:
    """The storages an op's outputs occupy that none of its inputs did: what the op allocated."""
    if _aliases(func):
        return []
    inputs = {id(t.untyped_storage()) for t in _tensors((args, kwargs))}
    fresh = {}
    for t in _tensors(out):
        st = t.untyped_storage()
        if id(st) not in inputs:
            fresh[id(st)] = st
    return list(fresh.values())


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


@contextlib.contextmanager
def track_memory(limit_bytes: int | None = None):
    """Measure bytes of tensor storages allocated inside the block: `with track_memory() as mem:`.

    `mem.peak_bytes`, `mem.current_bytes`, `mem.timeline` and (on CUDA) `mem.cuda_peak_bytes`
    are filled in as the block runs. With `limit_bytes`, exceeding it raises
    `SimulatedOutOfMemoryError`, a subclass of `torch.OutOfMemoryError`.
    """
    if limit_bytes is not None and limit_bytes < 0:
        raise ValueError(f"limit_bytes must be >= 0 or None, got {limit_bytes}")
    log = MemoryLog(limit_bytes=limit_bytes)
    tracker = _Tracker(log)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        _note_cuda_max()
        cuda_start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    _active().append(log)
    start = time.perf_counter()
    try:
        with tracker:
            yield log
    finally:
        log.seconds = time.perf_counter() - start
        _active().remove(log)
        tracker.detach()
        if cuda:
            torch.cuda.synchronize()
            _note_cuda_max()
            log.cuda_peak_bytes = max(getattr(log, "_cuda_max", 0), 0) - cuda_start
            if log.cuda_peak_bytes < 0:
                log.cuda_peak_bytes = 0


def _active() -> list:
    if not hasattr(_local, "active"):
        _local.active = []
    return _local.active


def _note_cuda_max():
    """Fold the allocator's running max into every open tracker before a reset."""
    m = torch.cuda.max_memory_allocated()
    for log in _active():
        log._cuda_max = max(getattr(log, "_cuda_max", 0), m)


# The layer profiler lives in its own module; these names stay importable from here.
from .profile import LayerProfile, backward_work_bytes, profile_layers  # noqa: E402,F401
