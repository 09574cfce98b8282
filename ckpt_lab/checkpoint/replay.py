"""What a recompute must see again that no argument holds: random generators and autocast.
(Design notes 2 and 3, in NOTES.md.)

A dropout inside a checkpoint draws its mask twice, in the forward and in the recompute; the
gradient is exact only if both draws are the same. `Replay.capture` records, as the forward
starts, the generator of the CPU and of every CUDA device found in the tensors the function
uses (its arguments, nested in lists, tuples and dicts, and the parameters of its modules),
every ``torch.Generator`` passed as an argument, and the autocast settings of each device type;
`Replay.restored` runs the recompute under those states and puts the current ones back after
(``torch.random.fork_rng``), so the caller's random stream goes on as without a checkpoint. A
tensor on a device whose generator is not replayed is refused (meta tensors, which hold no
values, are exempt), unless ``preserve_rng_state=False`` says the function draws nothing there.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from .guards import CheckpointError


def _cuda_devices(tensors, preserve: bool) -> list[int]:
    """CUDA devices whose generators to replay; refuses devices whose generator is not."""
    devices = set()
    for t in tensors:
        if t.is_cpu:
            continue
        kind = t.device.type
        if kind == "cuda":
            devices.add(t.get_device())
        elif kind != "meta" and preserve:
            raise CheckpointError(
                f"a tensor of the checkpointed function is on device '{kind}', whose random "
                "generator ckpt_lab does not replay (only CPU and CUDA ones): a dropout there "
                "would draw another mask in the recompute. Pass preserve_rng_state=False if "
                f"the function draws no random numbers on '{kind}'.")
    return sorted(devices)


@functools.lru_cache(maxsize=1)
def _autocast_devices() -> tuple[str, ...]:
    """The device types whose autocast settings a recompute replays."""
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


@dataclass
class Replay:
    """What the recompute must see again: the random generators and the autocast settings."""

    cpu_rng: torch.Tensor | None
    cuda_devices: list[int]
    cuda_rng: list[torch.Tensor]
    autocast: list[tuple[str, bool, torch.dtype]]
    generators: list[tuple[torch.Generator, torch.Tensor]]   # those passed as arguments

    @staticmethod
    def capture(tensors, generators, preserve_rng_state: bool) -> "Replay":
        """The states now, as the forward starts (refuses a device it cannot replay)."""
        autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                    for d in _autocast_devices()]
        devices = _cuda_devices(tensors, preserve_rng_state)
        if not preserve_rng_state:
            return Replay(None, [], [], autocast, [])
        return Replay(torch.get_rng_state(), devices,
                      [torch.cuda.get_rng_state(d) for d in devices], autocast,
                      [(g, g.get_state()) for g in generators])

    @contextlib.contextmanager
    def restored(self):
        """Run the block as the forward ran; put the current generator states back after."""
        with contextlib.ExitStack() as stack:
            if self.cpu_rng is not None:
                stack.enter_context(torch.random.fork_rng(devices=self.cuda_devices))
                torch.set_rng_state(self.cpu_rng)
                for d, s in zip(self.cuda_devices, self.cuda_rng):
                    torch.cuda.set_rng_state(s, d)
                for g, s in self.generators:      # put back after the block, like fork_rng
                    stack.callback(g.set_state, g.get_state())
                    g.set_state(s)
            for device, enabled, dtype in self.autocast:
                stack.enter_context(torch.autocast(device_type=device, enabled=enabled,
                                                   dtype=dtype))
            yield
