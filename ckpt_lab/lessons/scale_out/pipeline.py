"""Lesson 12's pipeline runs: the layers and checkpoint segments each stage gets, the GPipe and
1F1B schedules, a stage's send/recv loop (`run_stage`) and one measured pipeline step, one stage
per rank."""
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


def run_stage(stage, order, xs, ys, loss_fn, width: int):
    """This rank's pipeline stage: run ("F", j) / ("B", j) on micro-batch j in `order`, over
    plain send/recv; a generator that yields (op, j) after each operation, so a caller can
    measure between them. Lesson 12 writes the same loop in a cell.

    Activations go forward with isend (their buffer is the stashed output anyway) and
    gradients go back with a blocking send: the previous stage posts that receive in the same
    order, so no two stages ever wait on each other. `forward` and `backward` are functions so
    that nothing of a micro-batch outlives its `stash` entry in a local variable."""
    i, pp = dist.get_rank(), dist.get_world_size()
    stash = {}                             # j -> (input, output, send), from F(j) to B(j)

    def recv(buffer, src):
        dist.recv(buffer, src=src)
        return buffer

    def forward(j):
        shape = (*xs[j].shape, width)
        h = xs[j] if i == 0 else recv(torch.empty(shape, device=xs[j].device), i - 1)
        out = stage(h.requires_grad_() if i > 0 else h)
        if i == pp - 1:
            stash[j] = (h, loss_fn(out, ys[j]) / len(xs), None)
        else:
            stash[j] = (h, out, dist.isend(out.detach(), dst=i + 1))

    def backward(j):
        h, out, sent = stash.pop(j)
        if i == pp - 1:
            out.backward()
        else:
            out.backward(recv(torch.empty_like(out), i + 1))
            sent.wait()                    # received long ago: the next stage ran F(j)
        if i > 0:
            dist.send(h.grad, dst=i - 1)

    for op, j in order:
        forward(j) if op == "F" else backward(j)
        yield op, j


def check_order(order, micro_batches: int) -> list[tuple[str, int]]:
    """`order` as a list of ("F", j) / ("B", j), refused unless it runs each forward and each
    backward of micro-batches 0 .. micro_batches - 1 once, every backward after its forward."""
    order = [(op, j) for op, j in order]
    done = set()
    for op, j in order:
        if op not in ("F", "B") or isinstance(j, bool) or not isinstance(j, int) \
                or not 0 <= j < micro_batches:
            raise ValueError(f"{(op, j)!r} is no operation: use ('F', j) or ('B', j) with "
                             f"0 <= j < {micro_batches}")
        if (op, j) in done:
            raise ValueError(f"{(op, j)!r} runs twice")
        if op == "B" and ("F", j) not in done:
            raise ValueError(f"('B', {j}) comes before ('F', {j}): a backward needs its forward")
        done.add((op, j))
    if len(done) != 2 * micro_batches:
        raise ValueError(f"the order runs {len(done)} of the {2 * micro_batches} operations of "
                         f"{micro_batches} micro-batches: every ('F', j) and ('B', j) once")
    return order


def pipeline_step(cfg, x, y, micro_batches: int, kind: str = "1f1b", segments=(),
                  orders=None, run=run_stage) -> dict:
    """Two or more pipeline stages, one per rank: one step of `micro_batches` micro-batches in
    the `kind` of schedule ("gpipe" or "1f1b"), or in `orders` (one order per stage, as
    `schedule` writes them), run by `run` (`run_stage`, or the lesson's own copy of it).
    `segments` are checkpoint spans of `model.layers()` planned for the whole model; each
    stage checkpoints its cut of them. Returns this stage's loss sum, peak, the bytes it
    stashes per micro-batch, the bytes live after each operation of the schedule and the most
    micro-batches it had in flight. Every stage gets the whole batch, whose rows must split
    into `micro_batches` equal micro-batches (checked first, before any process talks)."""
    check_batch(x, y, micro_batches, "micro-batches", "a micro_batches that divides "
                f"{x.size(0)}")
    schedule(kind, 1, 0, 1)                # an unknown schedule fails here, not mid-step
    stages, rank = dist.get_world_size(), dist.get_rank()
    if orders is not None and len(orders) != stages:
        raise ValueError(f"orders has {len(orders)} stage orders for {stages} stages")
    order = check_order(orders[rank] if orders is not None else
                        schedule(kind, stages, rank, micro_batches), micro_batches)
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

    def stage(h):
        for a, b, checkpointed in spans:
            h = _run_span(layers, a, b, h, checkpointed)
        return h

    losses = []

    def loss_fn(out, targets):
        loss = model.loss(out, targets)
        losses.append(loss.item())
        return loss

    xs, ys = x.to(device()).chunk(micro_batches), y.to(device()).chunk(micro_batches)
    in_flight, most, stash_bytes, live = 0, 0, [], []
    _zero_grads(model)
    with track_memory() as mem:
        for op, _ in run(stage, order, xs, ys, loss_fn, cfg.n_embd):
            before = live[-1] if live else 0
            live.append(mem.current_bytes)     # after each operation of the schedule
            in_flight += 1 if op == "F" else -1
            most = max(most, in_flight)
            if op == "F":
                stash_bytes.append(live[-1] - before)
    return {"rank": rank, "layers": (start, end), "spans": spans,
            "loss": sum(losses) / micro_batches, "peak_bytes": mem.peak_bytes,
            "stash_bytes": stash_bytes, "in_flight": most, "live_bytes": live,
            "grads": _grads(model), "rss_bytes": peak_rss_bytes()}
