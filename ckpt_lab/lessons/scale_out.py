"""The rank functions of lesson 12: what each process runs under `distributed.launch`.

They live in this module, not in the notebook, because every rank is a fresh Python
interpreter that imports the function it runs by name (see `ckpt_lab.distributed`). Each one
builds the same seeded GPT on every rank, takes its share of a global batch the caller passes
in, runs one measured training step and returns plain numbers (and tensors) to the caller:

* `whoami`: each rank says who it is, after an all-reduce.
* `ddp_step`: `DistributedDataParallel`, with or without checkpointing, loss and gradients.
* `ddp_pitfalls`: reentrant checkpointing under DDP, the failures and their fixes.
* `fsdp_step`: FSDP2 (`fully_shard`) with no checkpointing, ckpt_lab's checkpoint or PyTorch's
  `checkpoint_wrapper`; per-rank bytes by kind.
* `pipeline_step`: one pipeline stage per rank, plain send/recv, a GPipe or 1F1B schedule.

`single_step` is the one-process reference run in the caller and `one_process` its bytes by
kind; `bands` sorts a run's bytes into the bands of lesson 12's figure; `several` runs a list of
these in one launch (one process start-up for a whole experiment).
"""
from __future__ import annotations

import functools
import gc
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ckpt_lab.distributed import peak_rss_bytes
from ckpt_lab.memory import current_phase, track_memory
from ckpt_lab.models import build_model
from ckpt_lab.modules import checkpoint_modules


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


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, copied to the CPU (what goes back to the caller)."""
    return {name: p.grad.detach().to("cpu", copy=True) for name, p in model.named_parameters()
            if p.grad is not None}


def whoami() -> dict:
    """Who this process is: rank, world size, backend, device, process id, threads, and the
    sum of every rank's number (an all-reduce: proof the group talks)."""
    total = torch.tensor([float(dist.get_rank())], device=device())
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "device": str(device()), "pid": os.getpid(),
            "threads": torch.get_num_threads(), "sum_of_ranks": total.item()}


def single_step(cfg, x, y, policy="none", impl: str | None = None) -> tuple[float, dict]:
    """One process, whole global batch: the loss and every parameter's gradient."""
    model = build_model(cfg, policy=policy, impl=impl)
    loss = model(x, y)
    loss.backward()
    return loss.item(), _grads(model)


def one_process(cfg, x, y, policy="none", impl: str | None = None) -> dict:
    """One process, whole global batch, in the caller: bytes by kind, as `ddp_step` reports a
    rank's (gradients allocated before the measured forward + backward, then one Adam step)."""
    model = build_model(cfg, policy=policy, impl=impl)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        model(x, y).backward()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    params = list(model.parameters())
    return {"peak_bytes": mem.peak_bytes, "param_bytes": _local_bytes(params),
            "grad_bytes": _local_bytes(p.grad for p in params),
            "optimizer_bytes": _optimizer_bytes(opt)}


BANDS = ("weights", "gradients", "buckets", "Adam", "gathered weights", "activations & buffers")


def bands(run: dict) -> dict[str, int]:
    """A run's bytes at its peak, by band: what `one_process`, `ddp_step` or `fsdp_step`
    returned, as the stacked bars of lesson 12 draw it (FSDP's peak split by its probe)."""
    at = run.get("at_peak", {"gathered": 0, "other": run["peak_bytes"]})
    return {"weights": run["param_bytes"], "gradients": run["grad_bytes"],
            "buckets": run.get("bucket_bytes", 0), "Adam": run["optimizer_bytes"],
            "gathered weights": at["gathered"], "activations & buffers": at["other"]}


def several(calls) -> list:
    """Run several (function, args) pairs one after the other in the same ranks: one launch,
    one process start-up, for a whole experiment."""
    out = []
    for fn, args in calls:
        out.append(fn(*args))
        dist.barrier()
    return out


# ------------------------------------------------------------------------------------- DDP
def ddp_step(cfg, x, y, policy="none", impl: str | None = None, **ddp_options) -> dict:
    """One DDP step on this rank's rows: global mean loss, gradients (rank 0), and bytes:
    DDP's buckets, the forward + backward peak (gradients allocated before), Adam's states."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    _check_rows(x, y)
    model = build_model(cfg, policy=policy, impl=impl).to(device())
    ids = [device().index] if device().type == "cuda" else None
    with track_memory() as made:
        ddp = DDP(model, device_ids=ids, **ddp_options)
        gc.collect()                        # construction temporaries caught in reference cycles
    bucket_bytes = made.current_bytes       # what DDP keeps: its gradient buckets
    xr, yr = _my_rows(x), _my_rows(y)
    for p in model.parameters():            # gradients exist before the step (lesson 7)
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        loss = ddp(xr, yr)
        loss.backward()
    grads = _grads(model) if dist.get_rank() == 0 else None
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    params = list(model.parameters())
    return {"loss": mean.item() / dist.get_world_size(), "local_loss": loss.item(),
            "grads": grads, "peak_bytes": mem.peak_bytes, "rss_bytes": peak_rss_bytes(),
            "param_bytes": _local_bytes(params), "grad_bytes": _local_bytes(p.grad for p in params),
            "bucket_bytes": bucket_bytes, "optimizer_bytes": _optimizer_bytes(opt)}


def _optimizer_bytes(opt) -> int:
    """Bytes of the optimizer's per-parameter state tensors (Adam's two moments; not the
    one-element step counters)."""
    return _local_bytes(t for s in opt.state.values() for t in s.values()
                        if torch.is_tensor(t) and t.dim() > 0)


def _torch_ckpt(model, reentrant: bool, frozen: bool):
    """Checkpoint every block with torch.utils.checkpoint (reentrant or not); with ``frozen``
    also freeze the embedding: the blocks' input then needs no gradient (fine-tuning a model
    with frozen embeddings)."""
    if frozen:
        for p in model.chain[0].parameters():
            p.requires_grad_(False)
    layers = model.layers()

    def forward(x, targets=None):
        h = layers[0](x)
        for block in layers[1:-1]:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=reentrant)
        return model.loss(layers[-1](h), targets)
    model.forward = forward
    return model


def _frozen_embedding(model):
    """Freeze the embedding of a model that checkpoints its blocks itself."""
    for p in model.chain[0].parameters():
        p.requires_grad_(False)
    return model


# The reentrant pitfalls are PyTorch's reentrant design's: its nested backward fires every
# parameter's gradient accumulator from inside the outer backward, and its node has no edge to
# a parameter when no input requires grad. ckpt_lab's reentrant node takes the parameters as
# inputs and returns their gradients to the outer backward, so it has neither (its rows).
PITFALLS = [
    # (label, checkpoint: "torch reentrant" | "torch" | a ckpt_lab impl, ddp options, frozen)
    ("torch reentrant, find_unused_parameters=True", "torch reentrant",
     dict(find_unused_parameters=True), False),
    ("torch reentrant, static_graph=True", "torch reentrant", dict(static_graph=True), False),
    ("ckpt_lab hooks, find_unused_parameters=True", "hooks",
     dict(find_unused_parameters=True), False),
    ("torch reentrant, frozen embedding", "torch reentrant", {}, True),
    ("torch non-reentrant, frozen embedding", "torch", {}, True),
    # ckpt_lab's reentrant design takes the parameters its forward read as inputs: no trap
    ("ckpt_lab reentrant, find_unused_parameters=True", "reentrant",
     dict(find_unused_parameters=True), False),
    ("ckpt_lab reentrant, frozen embedding", "reentrant", {}, True),
]


def ddp_pitfalls(cfg, x, y, steps: int = 2) -> list[dict]:
    """Each case of `PITFALLS` for `steps` steps: "ok" and its losses, or the error it raised."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    _check_rows(x, y)
    rows = []
    for label, impl, options, frozen in PITFALLS:
        if impl.startswith("torch"):
            model = _torch_ckpt(build_model(cfg, policy="none").to(device()),
                                reentrant=impl == "torch reentrant", frozen=frozen)
        else:
            model = build_model(cfg, policy="every", impl=impl).to(device())
            if frozen:
                _frozen_embedding(model)
        ids = [device().index] if device().type == "cuda" else None
        ddp = DDP(model, device_ids=ids, **options)
        row = {"case": label, "outcome": "ok", "losses": [], "error": "", "missing_grads": 0}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # torch warns about the frozen input
                for _ in range(steps):
                    loss = ddp(_my_rows(x), _my_rows(y))
                    loss.backward()
                    row["losses"].append(loss.item())
        except RuntimeError as err:
            row["outcome"], row["error"] = "error", str(err).split("\n")[0]
        row["missing_grads"] = sum(p.grad is None for p in model.parameters() if p.requires_grad)
        rows.append(row)
        dist.barrier()
    return rows


# ------------------------------------------------------------------------------------ FSDP
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


def apply_checkpointing(model, how: str):
    """Checkpoint every transformer block of a `models.GPT` in place: "none", "ckpt_lab"
    (ckpt_lab.checkpoint_modules, hooks) or "torch" (PyTorch's apply_activation_checkpointing)."""
    from ckpt_lab.models import Block
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


def fsdp_step(cfg, x, y, checkpointing: str = "none", units: str = "layers") -> dict:
    """FSDP2 (`fully_shard`), every layer of the GPT its own unit (units="layers") or the
    whole model one unit ("root"): one warm-up step, then one measured forward + backward.
    Per-rank bytes by kind, the loss, the unit sizes and the number of all-gathers."""
    from torch.distributed.device_mesh import init_device_mesh
    _check_rows(x, y)
    mesh = init_device_mesh(device().type, (dist.get_world_size(),))
    model = build_model(cfg, policy="none").to(device())
    apply_checkpointing(model, checkpointing)           # checkpoint first, then shard
    unit_bytes = shard(model, units, mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xr, yr = _my_rows(x), _my_rows(y)
    first = model(xr, yr)                   # warm-up: gradients and Adam's moments exist
    first.backward()
    opt.step()
    first = first.detach().clone()
    dist.all_reduce(first)
    fsdp_params = _fsdp_params(model)
    with track_memory() as mem:
        probe = _Probe(mem, fsdp_params)
        with probe:
            loss = model(xr, yr)
            loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    params = list(model.parameters())
    return {"first_loss": first.item() / dist.get_world_size(),
            "loss": mean.item() / dist.get_world_size(), "param_bytes": _local_bytes(params),
            "grad_bytes": _local_bytes(p.grad for p in params),
            "optimizer_bytes": _optimizer_bytes(opt),
            "peak_bytes": mem.peak_bytes, "probe_peak_bytes": probe.peak_bytes,
            "at_peak": probe.at_peak, "gathered_peak_bytes": probe.gathered_peak_bytes,
            "unit_bytes": unit_bytes, "rss_bytes": peak_rss_bytes(),
            "all_gathers": sum(p.op.startswith("_allgather_base") for p in mem.timeline)}


# -------------------------------------------------------------------------------- pipeline
def stage_layers(model, stages: int, rank: int) -> tuple[int, int]:
    """The [start, end) range of `model.layers()` stage `rank` runs: blocks split evenly,
    the embedding on the first stage and the head on the last."""
    L = model.num_blocks
    if L % stages:
        raise ValueError(f"{L} blocks do not split evenly into {stages} stages")
    per = L // stages
    start = 0 if rank == 0 else 1 + rank * per
    end = 1 + (rank + 1) * per + (1 if rank == stages - 1 else 0)
    return start, end


def cut_segments(segments, start: int, end: int) -> list[tuple[int, int]]:
    """The checkpoint segments (layer spans) a stage running layers [start, end) gets: each
    planned segment clipped to the stage; one that crosses the boundary is cut in two."""
    out = []
    for a, b in segments:
        a, b = max(a, start), min(b, end)
        if a < b:
            out.append((a, b))
    return out


def schedule(kind: str, stages: int, rank: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order of ("F", i) forwards and ("B", i) backwards a stage runs.

    GPipe: every forward, then every backward. 1F1B (PipeDream-flush, Narayanan et al. 2021):
    `stages - rank - 1` warm-up forwards, then one forward and one backward in turn, so at most
    `stages - rank` micro-batches are in flight on this stage whatever `micro_batches` is.
    """
    M = micro_batches
    if kind == "gpipe":
        return [("F", i) for i in range(M)] + [("B", i) for i in range(M)]
    if kind != "1f1b":
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {kind!r}")
    warm = min(stages - rank - 1, M)
    order = [("F", i) for i in range(warm)]
    for i in range(M - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", i) for i in range(M - warm, M)]
    return order


def _run_span(layers, a: int, b: int, h, checkpointed: bool):
    from ckpt_lab.checkpoint import checkpoint, run_in_order
    fn = run_in_order(layers[a:b])
    if checkpointed:
        return checkpoint(fn, h, impl="hooks")
    return fn(h)


def pipeline_step(cfg, x, y, micro_batches: int, kind: str = "1f1b", segments=()) -> dict:
    """Two or more pipeline stages, one per rank, with plain send/recv: one step of
    `micro_batches` micro-batches in the given schedule. `segments` are checkpoint spans of
    `model.layers()` planned for the whole model; each stage checkpoints its cut of them.
    Returns this stage's loss sum, peak, the bytes it stashes per micro-batch, the bytes live
    after each operation of the schedule and the most micro-batches it had in flight. Every stage
    gets the whole batch, whose rows must split into `micro_batches` equal micro-batches
    (checked first, before any process talks)."""
    check_batch(x, y, micro_batches, "micro-batches", "a micro_batches that divides "
                f"{x.size(0)}")
    schedule(kind, 1, 0, 1)                # an unknown schedule fails here, not mid-step
    stages, rank = dist.get_world_size(), dist.get_rank()
    model = build_model(cfg, policy="none").to(device())
    layers = model.layers()
    start, end = stage_layers(model, stages, rank)
    mine = cut_segments(segments, start, end)
    spans, at = [], start                  # (a, b, checkpointed) covering [start, end)
    for a, b in mine:
        if at < a:
            spans.append((at, a, False))
        spans.append((a, b, True))
        at = b
    if at < end:
        spans.append((at, end, False))
    last = rank == stages - 1
    xs, ys = x.to(device()).chunk(micro_batches), y.to(device()).chunk(micro_batches)
    shape = (xs[0].size(0), xs[0].size(1), cfg.n_embd)
    stash, losses, in_flight, most, stash_bytes, live = {}, 0.0, 0, 0, [], []
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    # Activations go forward with isend (their buffer is the stashed output anyway) and
    # gradients go back with a blocking send: the previous stage posts that receive in the
    # same order, so no two stages ever wait on each other, and nothing lingers in a buffer.
    with track_memory() as mem:
        for op, i in schedule(kind, stages, rank, micro_batches):
            if op == "F":
                before = mem.current_bytes
                if rank == 0:
                    h = xs[i]
                else:
                    h = torch.empty(shape, device=device())
                    dist.recv(h, src=rank - 1)
                    h.requires_grad_()
                inp = h
                for a, b, c in spans:
                    h = _run_span(layers, a, b, h, c)
                if last:
                    h = model.loss(h, ys[i]) / micro_batches
                    losses += h.item()
                    sent = None
                else:
                    sent = dist.isend(h.detach(), dst=rank + 1)
                stash[i] = (inp, h, sent)
                del inp, h, sent
                in_flight += 1
                most = max(most, in_flight)
                stash_bytes.append(mem.current_bytes - before)
            else:
                inp, out, sent = stash.pop(i)
                if last:
                    out.backward()
                else:
                    grad = torch.empty_like(out)
                    dist.recv(grad, src=rank + 1)
                    sent.wait()              # received long ago: the next stage ran F(i)
                    out.backward(grad)
                    del grad
                del out, sent
                if rank > 0:
                    dist.send(inp.grad, dst=rank - 1)
                del inp
                in_flight -= 1
            live.append(mem.current_bytes)     # after each operation of the schedule
    return {"rank": rank, "layers": (start, end), "spans": spans, "loss": losses,
            "peak_bytes": mem.peak_bytes, "stash_bytes": stash_bytes, "in_flight": most,
            "live_bytes": live,
            "grads": _grads(model), "rss_bytes": peak_rss_bytes()}
