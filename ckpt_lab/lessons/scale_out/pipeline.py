"""Lesson 12's pipeline runs: the layers and checkpoint segments each stage gets, the GPipe and
1F1B schedules, and one pipeline step, one stage per rank, over plain send/recv."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ckpt_lab.training.distributed import peak_rss_bytes
from ckpt_lab.measure.memory import track_memory
from ckpt_lab.training.models import build_model

from .ranks import _grads, _zero_grads, check_batch, device


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
    _zero_grads(model)
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
