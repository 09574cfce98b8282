"""What the allocator itself saw: every allocation and free, read from ``torch.profiler``.

`track_memory` counts tensor storages as ATen operations create them. The allocator also
serves what an operation allocates and frees inside itself (a convolution's workspace, a
softmax backward's temporary) and what runs below the dispatcher (compiled kernels, where a
dispatch mode cannot look: under one, ``torch.compile`` runs the module eagerly). The
profiler's memory events see all of it: `profiled_memory` replays them in time order, and
`AllocatorRecording` is the same replay cut at operation boundaries, which
``track_memory(allocator=True)`` marks.

Each event carries the size the allocator itself counted: on the CPU the bytes asked for, on
CUDA the caching allocator's rounded block (what ``torch.cuda.memory_allocated`` adds up), on
every device and thread the profiled code runs on (autograd's device threads included). The
profiler needs no CUDA activity for them: memory events are recorded with the CPU's.

Like `track_memory`, the replay counts the blocks allocated while it records: the free of a
block allocated before is left out. On CUDA the allocator reports such frees faithfully, but
the CPU allocator knows a block's size only if it was allocated while some profiler ran, so it
reports none (PyTorch warns "Memory block of unknown size was allocated before the profiling
started") or, when an earlier profiled block had the same address, that block's stale size.

Starting and stopping the profiler, libkineto writes "USDT: ... profiler_start" and
"profiler_stop" lines to the process's stderr (file descriptor 2, which Jupyter shows under the
cell); `AllocatorRecording` drops those two lines and passes on anything else written there.
"""
from __future__ import annotations

import bisect
import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

MARK = "ckpt_lab.op#"     # the record_function name `op_mark` gives operation n: MARK + str(n)
_Fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)


@dataclass
class ProfiledMemory:
    """Allocator bytes over a profiled block, relative to its start: the highest point and
    what was still allocated at its end (on one device type)."""

    peak_bytes: int
    end_bytes: int


@dataclass
class OpLevels:
    """The allocator around one marked operation, in bytes relative to the block's start."""

    after_bytes: int      # allocated when the operation returned
    high_bytes: int       # the most allocated at any moment while it ran (its start included)

    @property
    def transient_bytes(self) -> int:
        """What the operation held only while it ran: its high-water mark above its end."""
        return self.high_bytes - self.after_bytes


def profiler_running() -> bool:
    """Whether a torch/autograd profiler is already recording in this thread."""
    return bool(torch._C._autograd._profiler_enabled())


def op_mark(n: int):
    """A profiler range named for operation `n` (cheap: no ATen op, no Python frame kept)."""
    if _Fast is not None:
        return _Fast(f"{MARK}{n}")
    return torch.profiler.record_function(f"{MARK}{n}")


class AllocatorRecording:
    """``torch.profiler`` (profile_memory=True) around a block; after it, the allocator's events.

    `events` holds (time ns, bytes, device) per allocation (bytes > 0) and free (< 0), in time
    order, of the blocks allocated while it recorded (`frees_left_out` counts the frees of
    blocks allocated before); `marks` holds the (start, end) time of every `op_mark` range, by
    operation number (when a number was marked twice, e.g. an op that raised and the next,
    the later range).
    """

    def __init__(self, cuda_activity: bool = False):
        self.cuda_activity = cuda_activity
        self.events: list[tuple[int, int, str]] = []
        self.marks: dict[int, tuple[int, int]] = {}
        self.frees_left_out = 0
        self.finished = False         # True once the block ran and its events were read
        self._prof = None

    def __enter__(self) -> "AllocatorRecording":
        if profiler_running():
            raise RuntimeError(
                "the allocator is read through torch.profiler, and a profiler is already "
                "recording here (your own torch.profiler.profile, or an enclosing "
                "track_memory(allocator=True) or profiled_memory): only one runs at a time. "
                "Drop allocator=True on the inner block, or read the outer profiler's events.")
        activities = [ProfilerActivity.CPU]
        if self.cuda_activity:
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, profile_memory=True)
        with without_trace_lines():
            self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        prof, self._prof = self._prof, None
        with without_trace_lines():
            prof.__exit__(*exc)
        reported, marks = [], []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.tag == _EventType.Allocation:
                f = node.extra_fields
                reported.append((node.start_time_ns, f.alloc_size, f.ptr, _device_name(f.device)))
            elif node.name.startswith(MARK):
                marks.append((node.start_time_ns, node.end_time_ns, int(node.name[len(MARK):])))
        held = {}                     # (address, device) -> bytes, of blocks allocated here
        for t, nbytes, ptr, dev in sorted(reported, key=lambda r: r[0]):
            if nbytes > 0:
                held[ptr, dev] = nbytes
                self.events.append((t, nbytes, dev))
            elif (ptr, dev) in held:
                self.events.append((t, -held.pop((ptr, dev)), dev))
            else:
                self.frees_left_out += 1
        for start, end, n in sorted(marks):
            self.marks[n] = (start, end)
        self.finished = True
        return False

    def replay(self, device: str | None = None) -> ProfiledMemory:
        """Peak and end of the running total: every device (None), one device ("cuda:0") or a
        device type ("cpu", "cuda")."""
        current = peak = 0
        for _, nbytes, dev in self.events:
            if device is None or dev == device or dev.split(":")[0] == device:
                current += nbytes
                peak = max(peak, current)
        return ProfiledMemory(peak, current)

    def devices(self) -> list[str]:
        """The devices that allocated or freed anything, e.g. ["cpu", "cuda:0"]."""
        return sorted({dev for _, _, dev in self.events})

    def op_levels(self) -> dict[int, OpLevels]:
        """The allocator's level after each marked operation and its high-water mark inside
        it (all devices together). An event at a range's first or last nanosecond counts as
        inside it."""
        times = [t for t, _, _ in self.events]
        levels, total = [], 0
        for _, nbytes, _ in self.events:
            total += nbytes
            levels.append(total)
        out = {}
        for n, (start, end) in self.marks.items():
            first = bisect.bisect_left(times, start)
            last = bisect.bisect_right(times, end)
            before = levels[first - 1] if first else 0
            after = levels[last - 1] if last else 0
            high = max([before] + levels[first:last])
            out[n] = OpLevels(after, high)
        return out


@contextlib.contextmanager
def without_trace_lines():
    """Drop the lines libkineto writes to file descriptor 2 as a profiler starts and stops
    ("USDT: ... profiler_start"); pass on everything else written there meanwhile."""
    try:
        saved = os.dup(2)
    except OSError:                       # no stderr to guard
        yield
        return
    if sys.stderr is not None:
        sys.stderr.flush()
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().splitlines(keepends=True)
                    if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))


def _device_name(device: torch.device) -> str:
    """"cpu", "cuda:0", ...: the key `track_memory` uses for a device."""
    return str(device) if device.type == "cpu" or device.index is None else \
        f"{device.type}:{device.index}"


def profiled_memory(fn, device: str = "cpu") -> ProfiledMemory:
    """Run ``fn()`` under ``torch.profiler`` (profile_memory=True) and replay the allocator's
    events for ``device`` ("cpu" or "cuda")."""
    want = torch.device(device).type
    with AllocatorRecording(cuda_activity=want == "cuda") as rec:
        fn()
    return rec.replay(want)
