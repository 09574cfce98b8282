"""Lesson 12's FSDP runs: FSDP2 (`fully_shard`) over the course's GPT, checkpointed by
ckpt_lab or by PyTorch first, and a probe that splits each rank's peak into the unsharded
(all-gathered) parameters and everything else."""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ckpt_lab.training.distributed import peak_rss_bytes
from ckpt_lab.measure.memory import current_phase, track_memory
from ckpt_lab.training.models import build_model
from ckpt_lab.checkpoint.wrap import checkpoint_modules

from .ranks import _check_rows, _mean_over_ranks, _my_rows, _state_bytes, device


class _Probe(TorchDispatchMode):
    """After every op: the live bytes `track_memory` counts, and how many of them are FSDP's
    unsharded (all-gathered) parameters.

    FSDP2 allocates each unit's unsharded parameters once and afterwards frees and
    re-allocates them by resizing the same storages in place (`untyped_storage().resize_`);
    `track_memory` follows those resizes, and this probe reads the storages' current sizes.
    """

    def __init__(self, log, fsdp_params):
        super().__init__()
        self.log, self.fsdp_params = log, fsdp_params
        self.peak_bytes, self.at_peak, self.gathered_peak_bytes = 0, {}, 0

    def gathered_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for fp in self.fsdp_params
                   for t in getattr(fp, "all_gather_outputs", []))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        gathered = self.gathered_bytes()
        self.gathered_peak_bytes = max(self.gathered_peak_bytes, gathered)
        live = self.log.current_bytes
        if live > self.peak_bytes:
            self.peak_bytes = live
            self.at_peak = {"gathered": gathered, "other": live - gathered,
                            "op": func.__name__, "phase": current_phase()}
        return out


def _fsdp_params(model) -> list:
    from torch.distributed.fsdp import FSDPModule
    out = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            if group is not None:
                out.extend(group.fsdp_params)
    return out


def apply_checkpointing(model, how: str):
    """Checkpoint every transformer block of a `models.GPT` in place: "none", "ckpt_lab"
    (ckpt_lab.checkpoint_modules, hooks) or "torch" (PyTorch's apply_activation_checkpointing)."""
    from ckpt_lab.training.models import Block
    if how == "none":
        return model
    if how == "ckpt_lab":
        checkpoint_modules(model, Block, impl="hooks")
    elif how == "torch":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, Block))
    else:
        raise ValueError(f"checkpointing must be 'none', 'ckpt_lab' or 'torch', got {how!r}")
    return model


def shard(model, units: str = "layers", mesh=None) -> list[int]:
    """FSDP2 units, bottom-up: each layer its own unit (units="layers"), then the root takes
    whatever is left; units="root" makes the whole model one unit. Returns each unit's bytes."""
    from torch.distributed.fsdp import fully_shard
    if units not in ("layers", "root"):
        raise ValueError(f"units must be 'layers' or 'root', got {units!r}")
    size = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    unit_bytes = [size(model)]
    if units == "layers":
        for layer in model.chain:           # bottom-up: each layer's parameters form a unit
            fully_shard(layer, mesh=mesh)
        unit_bytes = [size(layer) for layer in model.chain]
    fully_shard(model, mesh=mesh)           # and the root takes whatever is left
    return unit_bytes


ORDERS = ("checkpoint first", "shard first")


def fsdp_step(cfg, x, y, checkpointing: str = "none", units: str = "layers",
              order: str = "checkpoint first") -> dict:
    """FSDP2 (`fully_shard`), every layer of the GPT its own unit (units="layers") or the
    whole model one unit ("root"), checkpointed before sharding or after (`order`): one
    warm-up step, then one measured forward + backward. Per-rank bytes by kind, the loss, the
    unit sizes and the number of all-gathers."""
    from torch.distributed.device_mesh import init_device_mesh
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    _check_rows(x, y)
    mesh = init_device_mesh(device().type, (dist.get_world_size(),))
    model = build_model(cfg, policy="none").to(device())
    if order == "checkpoint first":
        apply_checkpointing(model, checkpointing)
        unit_bytes = shard(model, units, mesh)
    else:                                   # the wrapper then wraps each sharded block
        unit_bytes = shard(model, units, mesh)
        apply_checkpointing(model, checkpointing)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xr, yr = _my_rows(x), _my_rows(y)
    warm = model(xr, yr)                    # warm-up: gradients and Adam's moments exist
    warm.backward()
    opt.step()
    first_loss = _mean_over_ranks(warm)
    del warm                                # nothing of the warm-up's graph stays alive
    fsdp_params = _fsdp_params(model)
    with track_memory() as mem:
        probe = _Probe(mem, fsdp_params)
        with probe:
            loss = model(xr, yr)
            loss.backward()
    return {"first_loss": first_loss, "loss": _mean_over_ranks(loss), **_state_bytes(model, opt),
            "peak_bytes": mem.peak_bytes, "probe_peak_bytes": probe.peak_bytes,
            "at_peak": probe.at_peak, "gathered_peak_bytes": probe.gathered_peak_bytes,
            "unit_bytes": unit_bytes, "rss_bytes": peak_rss_bytes(),
            "all_gathers": sum(p.op.startswith("_allgather_base") for p in mem.timeline)}
