"""Activation offload: park saved activations in host memory instead of recomputing them.

Checkpointing trades memory for compute; offload trades it for PCIe traffic. Autograd hands
every tensor it keeps for backward to a *pack* hook and asks for it back through an *unpack*
hook (``torch.autograd.graph.saved_tensors_hooks``). Here pack copies a CUDA activation into
pinned host memory on a side stream and drops the device copy; unpack copies it back.

* The side stream first waits for the stream that produced the tensor, and the device tensor
  is marked as used by the side stream (``record_stream``) so the allocator does not hand its
  memory out before the copy has read it. Unpack makes the compute stream wait for the copy's
  event before copying back, so nothing reads a half-written buffer.
* Only tensors that holding on host frees on the device are moved: leaves (parameters, the
  input batch) and views of them (``weight.t()`` saved by ``nn.Linear``) stay, because their
  owner keeps them alive anyway; so do tensors under ``min_bytes`` (not worth a transfer).
  A tensor saved twice (ReLU's output, kept by the ReLU and by the next Linear) moves once.
* On a machine without a GPU there is nowhere to move a CPU tensor to. Then the hooks run in
  *accounting mode*: they count every tensor exactly as they would move it and hand it back
  unchanged, so ``OffloadStats`` says what a GPU run of the same model would transfer and how
  long that takes at ``bandwidth_bytes_per_s``, while ``copied_bytes`` stays 0.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch

# What pinned host<->device copies reach on PCIe 4.0 x16 in practice (peak is ~31.5 GB/s).
PCIE4_X16_BYTES_PER_S = 25_000_000_000


@dataclass
class OffloadStats:
    """What one ``offload_activations`` block moved (or, on CPU, would move)."""

    min_bytes: int
    bandwidth_bytes_per_s: float
    bytes_offloaded: int = 0
    bytes_restored: int = 0
    tensors: int = 0
    kept: int = 0
    copied_bytes: int = 0
    copy_events: list = field(default_factory=list, repr=False)

    @property
    def transfer_seconds(self) -> float:
        """Time both directions would take at ``bandwidth_bytes_per_s`` (an estimate, not a clock)."""
        return (self.bytes_offloaded + self.bytes_restored) / self.bandwidth_bytes_per_s

    def copy_seconds(self) -> float | None:
        """Measured GPU time of the copies so far (CUDA events); None if nothing was copied."""
        if not self.copy_events:
            return None
        for _, end in self.copy_events:
            end.synchronize()
        return sum(start.elapsed_time(end) for start, end in self.copy_events) / 1000


class _OnHost:
    """A saved activation parked off the device: the host copy and where it came from."""

    __slots__ = ("tensor", "device", "event", "nbytes", "__weakref__")

    def __init__(self, tensor, device, event, nbytes):
        self.tensor, self.device, self.event, self.nbytes = tensor, device, event, nbytes


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _owned_elsewhere(t: torch.Tensor) -> bool:
    """A leaf or a view of one: its owner keeps the memory alive whatever we do."""
    base = t._base if t._base is not None else t
    return base.is_leaf


class _Mover:
    """Copies CUDA tensors to pinned host memory on a side stream per device, and back."""

    def __init__(self, events: list):
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.events = events

    def _timed(self):
        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self.events.append(pair)
        return pair

    def to_host(self, t: torch.Tensor):
        stream = self.streams.get(t.device)
        if stream is None:
            stream = self.streams[t.device] = torch.cuda.Stream(device=t.device)
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(t.device))
        start, end = self._timed()
        with torch.cuda.stream(stream):
            start.record(stream)
            host.copy_(t, non_blocking=True)
            end.record(stream)
        t.record_stream(stream)
        return host, end

    def to_device(self, parked: _OnHost) -> torch.Tensor:
        compute = torch.cuda.current_stream(parked.device)
        compute.wait_event(parked.event)
        start, end = self._timed()
        start.record(compute)
        out = parked.tensor.to(parked.device, non_blocking=True)
        end.record(compute)
        return out


@contextlib.contextmanager
def offload_activations(min_bytes: int = 0,
                        bandwidth_bytes_per_s: float = PCIE4_X16_BYTES_PER_S):
    """Keep activations saved inside the block in host memory: ``with offload_activations() as s:``.

    Tensors of at least ``min_bytes`` are moved; ``s`` counts bytes both ways, estimates the
    transfer time at ``bandwidth_bytes_per_s`` and, on CUDA, measures it (``s.copy_seconds()``).
    CPU tensors are only counted (see the module docstring). Backward may run after the block.
    """
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"min_bytes must be an int >= 0 (smaller saved tensors stay where "
                         f"they are), got {min_bytes!r}")
    if isinstance(bandwidth_bytes_per_s, bool) or \
            not isinstance(bandwidth_bytes_per_s, (int, float)) or \
            not bandwidth_bytes_per_s > 0 or bandwidth_bytes_per_s == float("inf"):
        raise ValueError(f"bandwidth_bytes_per_s must be a positive finite number such as "
                         f"{PCIE4_X16_BYTES_PER_S:.3g} (PCIe 4.0 x16), got "
                         f"{bandwidth_bytes_per_s!r}")
    stats = OffloadStats(min_bytes, bandwidth_bytes_per_s)
    mover = _Mover(stats.copy_events)
    # Weak both ways: backward frees each parked copy as soon as autograd lets go of it.
    parked: dict[int, tuple[weakref.ref, weakref.ref]] = {}

    def pack(t: torch.Tensor):
        nbytes = _nbytes(t)
        if nbytes < min_bytes or _owned_elsewhere(t):
            stats.kept += 1
            return t
        seen = parked.get(id(t))
        entry = seen[1]() if seen is not None and seen[0]() is t else None
        if entry is not None:
            return entry
        if t.is_cuda:
            host, event = mover.to_host(t)
            stats.copied_bytes += nbytes
            entry = _OnHost(host, t.device, event, nbytes)
        else:
            entry = _OnHost(t, None, None, nbytes)
        parked[id(t)] = (weakref.ref(t), weakref.ref(entry))
        stats.tensors += 1
        stats.bytes_offloaded += nbytes
        return entry

    def unpack(entry):
        if isinstance(entry, torch.Tensor):
            return entry
        stats.bytes_restored += entry.nbytes
        return entry.tensor if entry.device is None else mover.to_device(entry)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield stats
    finally:
        parked.clear()
