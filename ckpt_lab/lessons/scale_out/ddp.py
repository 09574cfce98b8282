"""Lesson 12's DDP runs: one `DistributedDataParallel` step on a rank's share of the batch,
with its bytes by kind, and the pitfalls of reentrant checkpointing under DDP, each run until it
fails or finishes its steps."""
from __future__ import annotations

import gc
import warnings

import torch
import torch.distributed as dist

from ckpt_lab.training.distributed import peak_rss_bytes
from ckpt_lab.measure.memory import track_memory
from ckpt_lab.training.models import build_model

from .ranks import (_check_rows, _grads, _mean_over_ranks, _my_rows, _state_bytes, _zero_grads,
                    device)


def _ddp(model, **ddp_options):
    """``model`` wrapped in DDP on this rank's device."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device().index] if device().type == "cuda" else None
    return DDP(model, device_ids=ids, **ddp_options)


def ddp_step(cfg, x, y, policy="none", impl: str | None = None, **ddp_options) -> dict:
    """One DDP step on this rank's rows: global mean loss, gradients (rank 0), and bytes:
    DDP's buckets, the forward + backward peak (gradients allocated before), Adam's states;
    `ddp_options` go to DistributedDataParallel (e.g. gradient_as_bucket_view=True)."""
    _check_rows(x, y)
    model = build_model(cfg, policy=policy, impl=impl).to(device())
    with track_memory() as made:
        ddp = _ddp(model, **ddp_options)
        gc.collect()                        # construction temporaries caught in reference cycles
    bucket_bytes = made.current_bytes       # what DDP keeps: its gradient buckets
    xr, yr = _my_rows(x), _my_rows(y)
    _zero_grads(model)                      # gradients exist before the step (lesson 7)
    with track_memory() as mem:
        loss = ddp(xr, yr)
        loss.backward()
    grads = _grads(model) if dist.get_rank() == 0 else None
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    storages = len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})
    return {"loss": _mean_over_ranks(loss), "local_loss": loss.item(),
            "grads": grads, "peak_bytes": mem.peak_bytes, "rss_bytes": peak_rss_bytes(),
            "bucket_bytes": bucket_bytes, **_state_bytes(model, opt),
            # distinct storages behind the gradients: one a parameter, or DDP's few flat buckets
            # when the gradients are views of them (gradient_as_bucket_view=True)
            "grad_storages": storages,
            "grads_in_buckets": storages < len(list(model.parameters()))}


def _torch_ckpt(model, reentrant: bool, frozen: bool):
    """Checkpoint every block with torch.utils.checkpoint (reentrant or not); with ``frozen``
    also freeze the embedding: the blocks' input then needs no gradient (fine-tuning a model
    with frozen embeddings)."""
    if frozen:
        _frozen_embedding(model)
    layers = model.layers()

    def forward(x, targets=None):
        h = layers[0](x)
        for block in layers[1:-1]:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=reentrant)
        return model.loss(layers[-1](h), targets)
    model.forward = forward
    return model


def _frozen_embedding(model):
    """Freeze the embedding of a model: its blocks' input then needs no gradient."""
    for p in model.chain[0].parameters():
        p.requires_grad_(False)
    return model


# The reentrant pitfalls are PyTorch's reentrant design's: its nested backward fires every
# parameter's gradient accumulator from inside the outer backward, and its node has no edge to
# a parameter when no input requires grad. ckpt_lab's reentrant node takes the parameters as
# inputs and returns their gradients to the outer backward, so it has neither (its rows).
# Rows 1-5 are PyTorch's checkpoint, what a learner calls; 6-8 ckpt_lab's designs.
PITFALLS = [
    # (label, checkpoint: "torch reentrant" | "torch" | a ckpt_lab impl, ddp options, frozen,
    #  why it fails or works)
    ("torch reentrant, find_unused_parameters=True", "torch reentrant",
     dict(find_unused_parameters=True), False,
     "DDP marked the checkpoint's parameters ready after the forward (not in the graph); the "
     "recompute makes their gradients, ready a second time. Fix: 3, or 2"),
    ("torch reentrant, static_graph=True", "torch reentrant", dict(static_graph=True), False,
     "DDP records the parameters used in step 1 and stops searching"),
    ("torch non-reentrant, find_unused_parameters=True", "torch",
     dict(find_unused_parameters=True), False,
     "the forward builds the real graph: DDP reaches every parameter"),
    ("torch reentrant, frozen embedding", "torch reentrant", {}, True,
     "the blocks' input needs no grad: their parameters get no gradient, DDP's reduction never "
     "finishes and step 2 refuses. Fix: 5, or make the input require grad"),
    ("torch non-reentrant, frozen embedding", "torch", {}, True,
     "non-reentrant differentiates through the recomputed graph, whatever its inputs"),
    # ckpt_lab's reentrant design takes the parameters its forward read as inputs: no trap
    ("ckpt_lab reentrant, find_unused_parameters=True", "reentrant",
     dict(find_unused_parameters=True), False,
     "ckpt_lab's reentrant node takes the parameters its forward read as inputs"),
    ("ckpt_lab reentrant, frozen embedding", "reentrant", {}, True,
     "ckpt_lab's reentrant node takes the parameters its forward read as inputs"),
    # ckpt_lab's non-reentrant design, as PyTorch's (3)
    ("ckpt_lab hooks, find_unused_parameters=True", "hooks",
     dict(find_unused_parameters=True), False,
     "ckpt_lab's hooks design builds the real graph, as in 3"),
]


def ddp_pitfalls(cfg, x, y, steps: int = 2) -> list[dict]:
    """Each case of `PITFALLS` for `steps` steps: "ok" and its losses, or the error it raised,
    and why."""
    _check_rows(x, y)
    rows = []
    for label, impl, options, frozen, why in PITFALLS:
        if impl.startswith("torch"):
            model = _torch_ckpt(build_model(cfg, policy="none").to(device()),
                                reentrant=impl == "torch reentrant", frozen=frozen)
        else:
            model = build_model(cfg, policy="every", impl=impl).to(device())
            if frozen:
                _frozen_embedding(model)
        ddp = _ddp(model, **options)
        row = {"case": label, "outcome": "ok", "losses": [], "error": "", "missing_grads": 0,
               "why": why}
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
