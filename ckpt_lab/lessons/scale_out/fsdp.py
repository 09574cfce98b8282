"""Lesson 12's FSDP runs: one FSDP2 step over the course's GPT, which a `prepare` function
checkpoints and shards (the preparations here, or the lesson's own, written in a cell), and a
probe that splits each rank's peak into the unsharded (all-gathered) parameters and everything
else. `prepare` travels to the ranks by name, so it is a plain importable function."""
from __future__ import annotations

import functools

import torch
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
    out = []
    for m in model.modules():
        group = _group(m)
        if group is not None:
            out.extend(group.fsdp_params)
    return out


def apply_checkpointing(model, how: str = "torch"):
    """Checkpoint every transformer block of a `models.GPT` in place: "torch" (PyTorch's
    apply_activation_checkpointing, non-reentrant), "ckpt_lab" (ckpt_lab.checkpoint_modules,
    hooks) or "none"."""
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


def shard_layers(model):
    """FSDP2 units bottom-up: each layer of `model.layers()` its own unit, then the root,
    which takes whatever no layer claimed."""
    from torch.distributed.fsdp import fully_shard
    for layer in model.layers():
        fully_shard(layer)
    fully_shard(model)
    return model


def one_unit(model):
    """The whole model one FSDP2 unit: one all-gather brings every weight at once."""
    from torch.distributed.fsdp import fully_shard
    fully_shard(model)
    return model


def checkpoint_then_shard(model):
    """PyTorch's checkpoint_wrapper on every block, then `shard_layers`."""
    return shard_layers(apply_checkpointing(model, "torch"))


def ckpt_lab_then_shard(model):
    """ckpt_lab's checkpoint_modules on every block, then `shard_layers`."""
    return shard_layers(apply_checkpointing(model, "ckpt_lab"))


def shard_then_checkpoint(model):
    """`shard_layers` first, then PyTorch's checkpoint_wrapper around each sharded block."""
    return apply_checkpointing(shard_layers(model), "torch")


def unit_bytes(model) -> list[int]:
    """The unsharded bytes of each FSDP2 unit's own parameters (those no inner unit holds),
    bottom-up; units that hold none are left out."""
    groups = [_group(m) for m in list(model.modules())[1:]] + [_group(model)]  # the root last
    return [sum(fp._orig_size.numel() * fp.sharded_param.dtype.itemsize for fp in g.fsdp_params)
            for g in groups if g is not None and g.fsdp_params]


def _group(module):
    from torch.distributed.fsdp import FSDPModule
    if isinstance(module, FSDPModule):
        return module._get_fsdp_state()._fsdp_param_group
    return None


def fsdp_step(cfg, x, y, prepare=shard_layers) -> dict:
    """FSDP2 (`fully_shard`) over the course's GPT, which `prepare(model)` checkpoints and
    shards in place (an importable function, e.g. `checkpoint_then_shard` or one of the
    lesson's own): one warm-up step, then one measured forward + backward. Per-rank bytes by
    kind, the loss, the unit sizes and the number of all-gathers."""
    if not callable(prepare):
        raise TypeError(f"prepare must be a function that checkpoints and shards a model in "
                         f"place (e.g. scale_out.checkpoint_then_shard), got {prepare!r}")
    _check_rows(x, y)
    model = build_model(cfg, policy="none").to(device())
    model = prepare(model) or model
    units = unit_bytes(model)
    if not units:
        raise ValueError(f"{getattr(prepare, '__name__', prepare)} left no FSDP unit: call "
                         "fully_shard on the model (and its layers) in it")
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
            "unit_bytes": units, "rss_bytes": peak_rss_bytes(),
            "all_gathers": sum(p.op.startswith("_allgather_base") for p in mem.timeline)}
