"""What every rank function of lesson 12 shares: this rank's device and its share of a global
batch (refused before any work when it does not split), parameter gradients and the bytes of
local storages, the global mean loss; `whoami`, the smallest rank function, and `several`,
which runs a list of them in one launch."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def device() -> torch.device:
    """This rank's device: its own GPU under NCCL, the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_batch(x: torch.Tensor, y: torch.Tensor, parts, what: str, fix: str) -> None:
    """Refuse, before any work, a batch that does not split into `parts` equal shares.

    ``torch.chunk`` splits an uneven batch into shares of different sizes, or fewer of them:
    one rank or stage then indexes a share that is not there, or receives a smaller tensor
    into a larger buffer (gloo allows it; the rows it did not write stay uninitialised).
    `what` names the shares ("micro-batches"), `fix` the other way out.
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"the number of {what} must be a positive int, got {parts!r}")
    rows = x.size(0)
    if y.size(0) != rows:
        raise ValueError(f"x has {rows} rows and y has {y.size(0)}: pass the targets of the "
                         "same batch")
    if rows % parts:
        fits = [n for n in (rows - rows % parts, rows - rows % parts + parts) if n > 0]
        raise ValueError(
            f"a batch of {rows} rows does not split into {parts} equal {what} (torch.chunk "
            f"would make uneven ones). Pass a batch whose rows are a multiple of {parts} "
            f"(e.g. {' or '.join(map(str, fits))}), or {fix}.")


def _check_rows(x: torch.Tensor, y: torch.Tensor) -> None:
    """The same on every rank before any collective: the batch splits into one share a rank."""
    n = dist.get_world_size()
    check_batch(x, y, n, "shares, one per rank", f"launch a world_size that divides {x.size(0)}")


def _my_rows(t: torch.Tensor) -> torch.Tensor:
    """This rank's equal share of a global batch (rows split in rank order), on its device."""
    n, r = dist.get_world_size(), dist.get_rank()
    if t.size(0) % n:
        raise ValueError(f"a global batch of {t.size(0)} rows does not split into {n} ranks")
    return t.chunk(n)[r].to(device())


def _zero_grads(model: nn.Module) -> None:
    """Allocate every parameter's gradient before the measured step (zeros; lesson 7)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, copied to the CPU (what goes back to the caller)."""
    return {name: p.grad.detach().to("cpu", copy=True) for name, p in model.named_parameters()
            if p.grad is not None}


def _local_bytes(tensors) -> int:
    """Bytes of the local storages behind tensors (DTensors: this rank's shard), each once."""
    seen = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _state_bytes(model: nn.Module, opt) -> dict[str, int]:
    """This rank's model state by kind: parameters, their gradients and the optimizer's
    per-parameter state tensors (Adam's two moments; not the one-element step counters)."""
    params = list(model.parameters())
    return {"param_bytes": _local_bytes(params),
            "grad_bytes": _local_bytes(p.grad for p in params),
            "optimizer_bytes": _local_bytes(t for s in opt.state.values() for t in s.values()
                                            if torch.is_tensor(t) and t.dim() > 0)}


def _mean_over_ranks(loss: torch.Tensor) -> float:
    """The mean of every rank's loss (an all-reduce; each rank ran an equal share of rows)."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def whoami() -> dict:
    """Who this process is: rank, world size, backend, device, process id, threads, and the
    sum of every rank's number (an all-reduce: proof the group talks)."""
    total = torch.tensor([float(dist.get_rank())], device=device())
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "device": str(device()), "pid": os.getpid(),
            "threads": torch.get_num_threads(), "sum_of_ranks": total.item()}


def several(calls) -> list:
    """Run several (function, args) or (function, args, kwargs) calls one after the other in
    the same ranks: one launch, one process start-up, for a whole experiment."""
    out = []
    for fn, args, *kwargs in calls:
        out.append(fn(*args, **(kwargs[0] if kwargs else {})))
        dist.barrier()
    return out
