"""Exact memory measurement for any device, CPU included.

`track_memory` watches every ATen operation through a `TorchDispatchMode`, registers each
tensor *storage* an operation creates (views share a storage, so they are counted once) and
holds a weak reference to it, so the moment autograd or Python drops the last reference the
bytes leave the books. Storages that grow under ``out=`` ops or ``resize_`` are re-read, and a
storage resized to 0 bytes (``t.untyped_storage().resize_(0)``, as FSDP does) leaves them.
The numbers are therefore a property of the program, not of an allocator: identical on a
laptop, on Binder and on a GPU. On CUDA the allocator's own peak is recorded beside them, and
``track_memory(allocator=True)`` also records, on any device, what the allocator itself saw
(its peak, and per operation the bytes the operation held only while it ran), read from the
profiler's memory events (`ckpt_lab.measure.allocator`).

What it cannot see (the allocator's own events can, and ``allocator=True`` records them;
``tests/measure/test_memory_vs_profiler.py`` compares the two workload by workload): memory an op
allocates and frees before returning (workspaces, e.g. convolution's), tensors made without
passing through the dispatcher (the random generator's state that ``torch.get_rng_state()``
returns, which every checkpoint captures; a Python number wrapped into a tensor for
``x * 0.5``), allocator rounding and caching (CUDA), and non-tensor memory (Python objects,
autograd's graph nodes).
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .allocator import AllocatorRecording, op_mark

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
    """Live bytes right after one operation; with ``track_memory(allocator=True)``, the
    allocator's view of it too (bytes relative to the block's start, every device)."""

    step: int
    live_bytes: int
    phase: str
    op: str
    allocator_bytes: int | None = None   # what the allocator held when the op returned
    transient_bytes: int | None = None   # its high-water mark inside the op, above that:
    #                                      what the op allocated and freed before returning


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
    # with allocator=True: the allocator's own peak and end over the block, above its level
    # at entry, all devices together and per device (None / empty otherwise)
    allocator_peak_bytes: int | None = None
    allocator_current_bytes: int | None = None
    allocator_peak_bytes_by_device: dict[str, int] = field(default_factory=dict)

    def phase_peaks(self) -> dict[str, int]:
        """The highest live bytes seen after an operation of each phase."""
        out: dict[str, int] = {}
        for p in self.timeline:
            out[p.phase] = max(out.get(p.phase, 0), p.live_bytes)
        return out

    def transients(self, n: int = 5) -> list[TimelinePoint]:
        """The `n` operations that held the most bytes only while they ran, largest first
        (needs ``track_memory(allocator=True)``)."""
        if self.allocator_peak_bytes is None:
            raise ValueError("transients need what the allocator saw: measure with "
                             "track_memory(allocator=True)")
        held = [p for p in self.timeline if p.transient_bytes]
        return sorted(held, key=lambda p: -p.transient_bytes)[:n]

    def allocator_peak_point(self) -> TimelinePoint:
        """The operation during or right after which the allocator held the most: its
        ``allocator_bytes + transient_bytes`` is the allocator's peak unless that fell between
        two operations (needs ``track_memory(allocator=True)``). At that point the gap to the
        tracker splits into ``transient_bytes`` and ``allocator_bytes - live_bytes`` (what the
        allocator holds that no tracked storage accounts for: rounding, workspaces, memory
        allocated outside an operation)."""
        if self.allocator_peak_bytes is None or not self.timeline:
            raise ValueError("the allocator's peak needs track_memory(allocator=True) around "
                             "at least one operation")
        return max(self.timeline, key=lambda p: p.allocator_bytes + p.transient_bytes)

    def peak_with_transients(self) -> int:
        """The tracker's peak with each operation's transient bytes counted while it runs:
        the highest ``live_bytes + transient_bytes`` (needs ``track_memory(allocator=True)``).
        Beyond it the allocator also holds memory made outside operations (a checkpoint's
        generator states) and, on CUDA, rounding and the workspaces it keeps."""
        if self.allocator_peak_bytes is None:
            raise ValueError("the transient bytes need what the allocator saw: measure with "
                             "track_memory(allocator=True)")
        return max([0] + [p.live_bytes + p.transient_bytes for p in self.timeline
                          if p.transient_bytes is not None])


class _Tracker(TorchDispatchMode):
    """Registers new storages created by each op and forgets them when they are freed."""

    def __init__(self, log: MemoryLog, mark=None):
        super().__init__()
        self.log = log
        self.mark = mark         # op number -> a profiler range around the op (allocator=True)
        # id(storage) -> (weak reference, bytes counted, device)
        self._refs: dict[int, tuple[weakref.ref, int, str]] = {}
        self._lock = threading.RLock()

    def __enter__(self):
        _listen(self)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _unlisten(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written = [(st, st.nbytes()) for st in _resizable_storages(func, args, kwargs)]
        if self.mark is None:
            out = func(*args, **kwargs)
        else:
            with self.mark(self.log.num_ops + 1):     # the number its timeline point gets
                out = func(*args, **kwargs)
        grew = [self.resized(st, before) for st, before in written]
        self._record(func, args, kwargs, out, any(grew))
        return out

    def _record(self, func, args, kwargs, out, grew: bool = False):
        log = self.log
        if func is _LIFT_FRESH:
            # torch.tensor(data) builds its tensor below the dispatcher, then hands it to
            # lift_fresh, whose output aliases it: the storage is new all the same.
            made = [t.untyped_storage() for t in _tensors(out)]
        else:
            made = new_storages(func, args, kwargs, out)
        new = [(id(st), st) for st in made if id(st) not in self._refs and st.nbytes() > 0]
        with self._lock:
            for key, st in new:
                self._count(key, st, st.nbytes())
            log.num_ops += 1
            log.timeline.append(TimelinePoint(log.num_ops, log.current_bytes, current_phase(),
                                              func.__name__))
            live = log.current_bytes
        if (new or grew) and log.limit_bytes is not None and live > log.limit_bytes:
            raise SimulatedOutOfMemoryError(live, log.limit_bytes, func.__name__)

    def _count(self, key: int, st, nbytes: int):
        """Put `nbytes` more of storage `st` on the books (a new storage, or one that grew)."""
        log, dev = self.log, str(st.device)
        old = self._refs.get(key)
        ref = old[0] if old is not None else weakref.ref(st, self._freer(key))
        self._refs[key] = (ref, (old[1] if old is not None else 0) + nbytes, dev)
        log.current_bytes += nbytes
        log.allocated_bytes += max(nbytes, 0)
        by = log.current_bytes_by_device
        by[dev] = by.get(dev, 0) + nbytes
        log.peak_bytes_by_device[dev] = max(log.peak_bytes_by_device.get(dev, 0), by[dev])
        log.peak_bytes = max(log.peak_bytes, log.current_bytes)

    def resized(self, st, before: int) -> bool:
        """Re-read the size of a storage that may have been resized from `before` bytes;
        True if the books grew.

        Growth is counted (all of it for a storage made in the block, the growth alone for
        one made before); shrinking releases what was counted, down to 0 for ``resize_(0)``.
        """
        now = st.nbytes()
        if now == before:
            return False
        key = id(st)
        with self._lock:
            entry = self._refs.get(key)
            counted = entry[1] if entry is not None else 0
            change = max(counted + now - before, 0) - counted
            if change == 0:
                return False
            self._count(key, st, change)
            if self._refs[key][1] == 0:
                del self._refs[key]
        return change > 0

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


_LIFT_FRESH = torch.ops.aten.lift_fresh.default


# ------------------------------------------------- storages that change size under an op
_RESIZE_OPS = frozenset(getattr(torch.ops.aten, n) for n in ("resize_", "resize_as_",
                                                             "_resize_output_")
                        if hasattr(torch.ops.aten, n))
_WRITTEN: dict = {}


def _resizable_args(func) -> tuple:
    """Positions/names of the arguments an op may resize: its ``out=`` tensors, or the
    tensor a ``resize_``-like op is called on (cached per op; empty for most ops)."""
    hit = _WRITTEN.get(func)
    if hit is None:
        resize = (func.overloadpacket in _RESIZE_OPS
                  or func.name() == "inductor::resize_storage_bytes_")
        hit = _WRITTEN[func] = tuple(
            a.name if a.kwarg_only else i
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
            and (a.kwarg_only or resize))
    return hit


def _resizable_storages(func, args, kwargs) -> list:
    """The storages of the tensors an op may resize, read before it runs."""
    found = []
    for where in _resizable_args(func):
        arg = kwargs.get(where) if isinstance(where, str) else (
            args[where] if where < len(args) else None)
        found += [t.untyped_storage() for t in _tensors(arg)]
    return found


_listeners_lock = threading.Lock()
_listening_threads = [0]
_original_storage_resize = torch.UntypedStorage.resize_


def _listeners() -> list:
    if not hasattr(_local, "trackers"):
        _local.trackers = []
    return _local.trackers


def _storage_resize(self, size):
    """``UntypedStorage.resize_`` while a tracker listens: no ATen op sees this call."""
    before = self.nbytes()
    out = _original_storage_resize(self, size)
    for tracker in list(_listeners()):
        tracker.resized(self, before)
    return out


def _listen(tracker):
    """Route storage resizes in this thread to `tracker` (patched only while one listens)."""
    _listeners().append(tracker)
    with _listeners_lock:
        _listening_threads[0] += 1
        torch.UntypedStorage.resize_ = _storage_resize


def _unlisten(tracker):
    _listeners().remove(tracker)
    with _listeners_lock:
        _listening_threads[0] -= 1
        if _listening_threads[0] == 0:
            torch.UntypedStorage.resize_ = _original_storage_resize


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


class StorageBirths(TorchDispatchMode):
    """Notes, weakly, every storage an operation creates while the block runs."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for st in new_storages(func, args, kwargs, out):
            self.storages[id(st)] = weakref.ref(st, self._forget(id(st)))
        return out

    def _forget(self, key: int):
        def forget(ref):
            if self.storages.get(key) is ref:
                del self.storages[key]
        return forget

    def created(self, st: torch.UntypedStorage) -> bool:
        """Whether an operation inside the block created this storage."""
        ref = self.storages.get(id(st))
        return ref is not None and ref() is st


@contextlib.contextmanager
def track_memory(limit_bytes: int | None = None, allocator: bool = False):
    """Measure bytes of tensor storages allocated inside the block: `with track_memory() as mem:`.

    `mem.peak_bytes`, `mem.current_bytes` and `mem.timeline` are filled in as the block runs.
    With `limit_bytes`, exceeding it raises `SimulatedOutOfMemoryError`, a subclass of
    `torch.OutOfMemoryError`. Storages resized by ``out=`` ops or ``resize_`` are re-read.

    With ``allocator=True`` the block also runs under ``torch.profiler`` (profile_memory=True)
    and, when it ends, `mem.allocator_peak_bytes` (and `_by_device`, `allocator_current_bytes`)
    hold the allocator's own peak and end above its level at entry, and every timeline point
    its `allocator_bytes` and `transient_bytes` (what the op allocated and freed before
    returning); `mem.transients(n)` lists the largest. The tracker's numbers do not change.
    One profiler runs at a time, so this refuses to start inside another.

    On CUDA, `mem.cuda_peak_bytes` is the allocator's peak above its level at entry. The
    allocator keeps one running maximum and track_memory does not reset it (your own
    ``torch.cuda.max_memory_allocated()`` survives the block), so it is exact when the block
    sets a new maximum, e.g. after ``torch.cuda.reset_peak_memory_stats()``, and None when the
    block stayed below an earlier one.

    Cannot see: memory an op allocates and frees before returning (workspaces such as
    convolution's), tensors made without the dispatcher (the RNG state tensors
    ``torch.get_rng_state()`` returns), allocator rounding and caching, non-tensor memory.
    """
    if limit_bytes is not None and limit_bytes < 0:
        raise ValueError(f"limit_bytes must be >= 0 or None, got {limit_bytes}")
    log = MemoryLog(limit_bytes=limit_bytes)
    recording = AllocatorRecording() if allocator else None
    tracker = _Tracker(log, op_mark if allocator else None)
    cuda = _CudaPeak.start() if torch.cuda.is_available() else None
    start = time.perf_counter()
    try:
        with recording if recording is not None else contextlib.nullcontext():
            with tracker:
                yield log
    finally:
        log.seconds = time.perf_counter() - start
        tracker.detach()
        if cuda is not None:
            log.cuda_peak_bytes = cuda.stop()
        if recording is not None and recording.finished:
            _read_allocator(log, recording)


def _read_allocator(log: MemoryLog, recording: AllocatorRecording):
    """Put what the allocator saw over the block into `log` and its timeline points."""
    whole = recording.replay()
    log.allocator_peak_bytes, log.allocator_current_bytes = whole.peak_bytes, whole.end_bytes
    log.allocator_peak_bytes_by_device = {dev: recording.replay(dev).peak_bytes
                                          for dev in recording.devices()}
    levels = recording.op_levels()
    for point in log.timeline:
        level = levels.get(point.step)
        if level is not None:
            point.allocator_bytes, point.transient_bytes = level.after_bytes, level.transient_bytes


@dataclass
class _CudaPeak:
    """The CUDA allocator's peak during a block, read without resetting its statistics."""

    allocated_at_start: int
    max_at_start: int

    @staticmethod
    def start() -> "_CudaPeak":
        torch.cuda.synchronize()
        return _CudaPeak(torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())

    def stop(self) -> int | None:
        """Bytes above the level at entry at the allocator's peak, or None if it is unknown."""
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        if peak > self.max_at_start:     # the running maximum was set inside the block
            return peak - self.allocated_at_start
        if torch.cuda.memory_allocated() == peak:   # the block ends at the old maximum
            return peak - self.allocated_at_start
        return None


def kept_after_forward(module, *inputs) -> int:
    """Bytes allocated by module(*inputs) and still alive after its forward: what backward needs."""
    with track_memory() as mem:
        out = module(*inputs)
        kept = mem.current_bytes
    del out
    return kept
