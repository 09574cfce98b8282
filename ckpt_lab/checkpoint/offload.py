"""Activation offload: park saved activations in host memory instead of recomputing them.

Checkpointing trades memory for compute; offload trades it for PCIe traffic. Autograd hands
every tensor it keeps for backward to a *pack* hook and asks for it back through an *unpack*
hook (``torch.autograd.graph.saved_tensors_hooks``). Here pack copies the *storage* of a CUDA
activation into pinned host memory on a side stream and drops the device copy; unpack copies
it back.

* What moves: memory the forward owns. While the block runs, a small ``TorchDispatchMode``
  notes (weakly) every storage an operation creates. A saved tensor moves when its storage was
  created inside the block, unless it is a leaf that requires grad or a view of one. So
  parameters and their views (``weight.t()`` saved by ``nn.Linear``) and whatever existed
  before the block (the input batch, anything computed before the ``with``) stay where they are:
  their owner keeps that memory alive anyway, so a copy would free nothing. Everything the
  forward makes moves: activations, dropout masks, LayerNorm's mean and 1/std, the causal
  ``~mask``, positions. Storages under ``min_bytes`` stay too (not worth a transfer).
  Noting births is the cheap way to know what predates the block: listing the storages alive
  at entry would mean walking every live object, while the mode costs one Python call per
  operation, only inside the block, and holds nothing alive.
* One storage, one copy: autograd often saves a storage under several views (ReLU's output,
  kept by the ReLU and by the next Linear; a softmax output, kept by the softmax and, reshaped,
  by the matmul with V). Each storage is copied and counted once, and unpack rebuilds every
  view from the restored copy with its own size, stride and storage offset. In backward a
  storage comes back once per autograd node that reads it: the views one node unpacks share
  one restored copy, held here only weakly, so it is freed with that node's tensors.
* CUDA: the side stream first waits for the stream that produced the tensor, and the device
  storage is marked as used by the side stream (``record_stream``) so the allocator does not
  hand its memory out before the copy has read it. Unpack makes the compute stream wait for
  the copy's event before copying back, so nothing reads a half-written buffer.
* On a machine without a GPU there is nowhere to move a CPU tensor to. Then the hooks run in
  *accounting mode*: they count every storage exactly as they would move it (once per storage
  out, once per reading node back) and hand each tensor back unchanged, so ``OffloadStats``
  says what a GPU run of the same model would transfer and how long that takes at
  ``bandwidth_bytes_per_s``, while ``copied_bytes`` stays 0.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch

from ..measure.memory import StorageBirths

# What pinned host<->device copies reach on PCIe 4.0 x16 in practice (peak is ~31.5 GB/s).
PCIE4_X16_BYTES_PER_S = 25_000_000_000


@dataclass
class OffloadStats:
    """What one ``offload_activations`` block moved (or, on CPU, would move).

    ``tensors`` saved tensors were parked, in ``storages`` distinct storages of
    ``bytes_offloaded`` bytes in all; ``kept`` saved tensors stayed in place.
    """

    min_bytes: int
    bandwidth_bytes_per_s: float
    bytes_offloaded: int = 0
    bytes_restored: int = 0
    tensors: int = 0
    kept: int = 0
    storages: int = 0
    copied_bytes: int = 0
    copy_events: list = field(default_factory=list, repr=False)

    @property
    def transfer_seconds(self) -> float:
        """Time both directions take at ``bandwidth_bytes_per_s`` (an estimate, not a clock)."""
        return (self.bytes_offloaded + self.bytes_restored) / self.bandwidth_bytes_per_s

    def copy_seconds(self) -> float | None:
        """Measured GPU time of the copies so far (CUDA events); None if nothing was copied."""
        if not self.copy_events:
            return None
        for _, end in self.copy_events:
            end.synchronize()
        return sum(start.elapsed_time(end) for start, end in self.copy_events) / 1000


class _Parked:
    """One storage parked off the device: its host copy (None in accounting mode) and who last
    read it back."""

    __slots__ = ("nbytes", "host", "device", "event", "restored", "reader", "__weakref__")

    def __init__(self, nbytes, host=None, device=None, event=None):
        self.nbytes, self.host, self.device, self.event = nbytes, host, device, event
        self.restored = None   # weakref to the restored device storage while a view uses it
        self.reader = None     # (backward pass, node) that last read it, in accounting mode


class _Saved:
    """What pack returns for one moved tensor: its storage's parking place and its geometry."""

    __slots__ = ("parked", "tensor", "dtype", "size", "stride", "offset")

    def __init__(self, parked: _Parked, t: torch.Tensor, keep: bool):
        self.parked, self.tensor = parked, (t if keep else None)
        self.dtype, self.size, self.stride, self.offset = \
            t.dtype, tuple(t.size()), t.stride(), t.storage_offset()


def _grad_leaf_or_view(t: torch.Tensor) -> bool:
    """A leaf that requires grad (a parameter) or a view of one: its owner keeps the memory."""
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


def _reader():
    """The backward pass and autograd node now unpacking, or None outside backward."""
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    return torch._C._current_graph_task_id(), node._sequence_nr(), id(node)


def _view(storage: torch.UntypedStorage, saved: _Saved) -> torch.Tensor:
    """The saved tensor rebuilt on a restored storage: as_strided with its size, stride, offset."""
    return torch.empty(0, dtype=saved.dtype, device=storage.device).set_(
        storage, saved.offset, saved.size, saved.stride)


class _Mover:
    """Copies CUDA storages to pinned host memory on a side stream per device, and back."""

    def __init__(self, events: list):
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.events = events

    def moves(self, t: torch.Tensor) -> bool:
        """Whether this tensor's storage is really copied (else it is only counted)."""
        return t.is_cuda

    def _timed(self):
        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self.events.append(pair)
        return pair

    def to_host(self, st: torch.UntypedStorage, device: torch.device):
        """Start copying a device storage into pinned memory; the host bytes and a done event."""
        stream = self.streams.get(device)
        if stream is None:
            stream = self.streams[device] = torch.cuda.Stream(device=device)
        src = torch.empty(0, dtype=torch.uint8, device=device).set_(st)
        host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(device))
        start, end = self._timed()
        with torch.cuda.stream(stream):
            start.record(stream)
            host.copy_(src, non_blocking=True)
            end.record(stream)
        src.record_stream(stream)
        return host, end

    def to_device(self, parked: _Parked) -> torch.UntypedStorage:
        """A fresh device storage holding the parked bytes, ordered after the copy out."""
        compute = torch.cuda.current_stream(parked.device)
        compute.wait_event(parked.event)
        start, end = self._timed()
        start.record(compute)
        flat = parked.host.to(parked.device, non_blocking=True)
        end.record(compute)
        return flat.untyped_storage()


@contextlib.contextmanager
def offload_activations(min_bytes: int = 0,
                        bandwidth_bytes_per_s: float = PCIE4_X16_BYTES_PER_S):
    """Keep activations saved inside the block in host memory: ``with offload_activations() as s:``.

    Storages of at least ``min_bytes`` that the block's forward created are moved, each once;
    ``s`` counts bytes both ways, estimates the transfer time at ``bandwidth_bytes_per_s`` and,
    on CUDA, measures it (``s.copy_seconds()``). CPU tensors are only counted (see the module
    docstring). Backward may run after the block.
    """
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"min_bytes must be an int >= 0 (smaller saved storages stay where "
                         f"they are), got {min_bytes!r}")
    if isinstance(bandwidth_bytes_per_s, bool) or \
            not isinstance(bandwidth_bytes_per_s, (int, float)) or \
            not bandwidth_bytes_per_s > 0 or bandwidth_bytes_per_s == float("inf"):
        raise ValueError(f"bandwidth_bytes_per_s must be a positive finite number such as "
                         f"{PCIE4_X16_BYTES_PER_S:.3g} (PCIe 4.0 x16), got "
                         f"{bandwidth_bytes_per_s!r}")
    stats = OffloadStats(min_bytes, bandwidth_bytes_per_s)
    mover = _Mover(stats.copy_events)
    births = StorageBirths()
    # By storage, weak both ways: backward frees each parked copy as soon as autograd lets go.
    parked: dict[int, tuple[weakref.ref, weakref.ref]] = {}

    def pack(t: torch.Tensor):
        if t.layout != torch.strided or t.device.type == "meta":
            stats.kept += 1
            return t
        st = t.untyped_storage()
        if _grad_leaf_or_view(t) or not births.created(st) or st.nbytes() < min_bytes:
            stats.kept += 1
            return t
        seen = parked.get(id(st))
        entry = seen[1]() if seen is not None and seen[0]() is st else None
        copies = mover.moves(t)
        if entry is None:
            if copies:
                host, event = mover.to_host(st, t.device)
                stats.copied_bytes += st.nbytes()
                entry = _Parked(st.nbytes(), host, t.device, event)
            else:
                entry = _Parked(st.nbytes())
            parked[id(st)] = (weakref.ref(st), weakref.ref(entry))
            stats.storages += 1
            stats.bytes_offloaded += st.nbytes()
        stats.tensors += 1
        return _Saved(entry, t, keep=not copies)

    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        entry = saved.parked
        if entry.host is None:   # accounting mode: a GPU would restore once per reading node
            reader = _reader()
            if reader is None or reader != entry.reader:
                entry.reader = reader
                stats.bytes_restored += entry.nbytes
            return saved.tensor
        storage = entry.restored() if entry.restored is not None else None
        if storage is None:
            storage = mover.to_device(entry)
            entry.restored = weakref.ref(storage)
            stats.bytes_restored += entry.nbytes
        return _view(storage, saved)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), births:
            yield stats
    finally:
        parked.clear()
        births.storages.clear()
