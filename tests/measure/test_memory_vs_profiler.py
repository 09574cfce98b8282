"""track_memory against the CPU allocator's own events, workload by workload.

``torch.profiler.profile(profile_memory=True)`` records every allocation and free the CPU
allocator makes, with the operation it happened in. Replaying them gives the allocator's
peak. track_memory should agree exactly once the two things it cannot see by design are
taken out of the allocator's list:

* transient allocations: made and freed while one operation runs (convolution's workspaces,
  small buffers inside softmax or a loss);
* allocations made outside any ATen operation: the generator state ``torch.get_rng_state()``
  returns (a checkpoint captures one in the forward and puts the current one aside around
  the recompute), a Python number wrapped into a 0-dim tensor for ``x * 0.5``.

Each workload prints the raw difference and what explains it (run with ``-s`` to read them).
"""
import os

import pytest
import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from ckpt_lab import checkpoint, track_memory
from ckpt_lab.measure.allocator import profiled_memory
from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config

RNG_STATE_BYTES = torch.get_rng_state().numel()   # the CPU generator's state: 5056 bytes


def allocator_events(run):
    """Run under the profiler and track_memory; the tracker's log and the allocations."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with track_memory() as mem:
            run()

    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = sorted((n for n in walk(tree) if n.tag == _EventType.Allocation),
                    key=lambda n: n.start_time_ns)
    return mem, events


def seen_op(node):
    """The operation track_memory's dispatch mode ran that `node` happened in, or None.

    In the profiler's tree the ops a Python dispatch mode runs hang under a node named
    "PythonDispatchMode"; ops they call in turn (an op's own ``empty``) hang below them.
    """
    while node is not None:
        parent = node.parent
        if parent is not None and parent.name == "PythonDispatchMode" \
                and node.name.startswith("aten::"):
            return node
        node = parent
    return None


def classify(events):
    """Each allocation or free event with why track_memory cannot see it (None: it can).

    "transient": allocated and freed while the one operation the tracker saw runs;
    "outside ATen ops": allocated where the tracker saw no operation running. A free gets the
    reason of its allocation.
    """
    reasons, open_allocs = [None] * len(events), {}
    for i, n in enumerate(events):
        if n.extra_fields.alloc_size > 0:
            open_allocs[n.extra_fields.ptr] = i
            if seen_op(n) is None:
                reasons[i] = "outside ATen ops"
            continue
        j = open_allocs.pop(n.extra_fields.ptr, None)
        if j is None:
            continue            # allocated before the block
        if reasons[j] is None and n.start_time_ns <= seen_op(events[j]).end_time_ns:
            reasons[j] = "transient"
        reasons[i] = reasons[j]
    return reasons


def replay(events, reasons=None):
    """(peak, final) bytes of the allocator's running total, counting only events whose
    reason is None (all of them without `reasons`)."""
    current = peak = 0
    for i, n in enumerate(events):
        if reasons is None or reasons[i] is None:
            current += n.extra_fields.alloc_size
            peak = max(peak, current)
    return peak, current


def unseen_bytes(events, reasons, why: str) -> list[int]:
    """Sizes of the allocations track_memory cannot see for reason `why`."""
    return [n.extra_fields.alloc_size for n, r in zip(events, reasons)
            if r == why and n.extra_fields.alloc_size > 0]


def mlp_step():
    torch.manual_seed(0)
    m, x = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)), torch.randn(32, 64)
    return lambda: m(x).square().mean().backward()


def gpt_step(policy):
    cfg = get_config("gpt-tiny")
    x, y = TextBatches(load_corpus(), 4, cfg.block_size, seed=0).get(0)
    m = build_model(cfg, policy).train()
    return lambda: m(x, y).backward()


def conv_step():
    cfg = get_config("resnet-tiny")
    m = build_model(cfg, "none").train()
    x = torch.randn(4, cfg.in_channels, cfg.image_size, cfg.image_size)
    y = torch.randint(0, cfg.num_classes, (4,))
    return lambda: m(x, y).backward()


def checkpointed_dropout_step():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 64))
    x = torch.randn(32, 64, requires_grad=True)
    return lambda: checkpoint(m, x).square().mean().backward()


def out_and_resize():
    a = torch.randn(1000)

    def run():
        c = torch.empty(0)
        torch.mul(a, 2, out=c)
        c.resize_(4000)
        d = c * 3
        del c
        return d
    return run


WORKLOADS = {
    # name: (build, what explains a raw difference)
    "MLP step": (mlp_step, "nothing: every byte passes through an op's output"),
    "GPT step": (lambda: gpt_step("none"),
                 "Python numbers wrapped into 8-byte tensors for one op (x * scale) and small "
                 "buffers inside softmax and the loss"),
    "GPT step, every block checkpointed": (
        lambda: gpt_step("every"),
        "the generator state each checkpoint captures (5056 bytes on CPU), outside any op"),
    "conv step (ResNet)": (conv_step, "convolution workspaces, allocated and freed inside "
                                      "mkldnn_convolution / convolution_backward"),
    "checkpointed MLP with dropout": (checkpointed_dropout_step,
                                      "the generator states: one captured in the forward, "
                                      "one put aside and restored around the recompute"),
    "out= and resize_": (out_and_resize, "the Python numbers 2 and 3 wrapped into tensors; "
                                         "the grown storage itself is re-read and counted"),
}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_tracker_agrees_with_the_cpu_allocator_except_what_it_cannot_see(name, one_thread):
    build, explanation = WORKLOADS[name]
    run = build()
    run()   # warm-up: lazily created buffers do not belong to the step
    mem, events = allocator_events(run)
    raw_peak, _ = replay(events)
    reasons = classify(events)
    peak, final = replay(events, reasons)
    transient = unseen_bytes(events, reasons, "transient")
    outside = unseen_bytes(events, reasons, "outside ATen ops")
    print(f"\n{name}: tracker peak {mem.peak_bytes:,} B, allocator peak {raw_peak:,} B "
          f"(difference {raw_peak - mem.peak_bytes:,} B). Unseen by the tracker: "
          f"{len(transient)} transient allocations (largest {max(transient, default=0):,} B), "
          f"{len(outside)} outside ATen ops ({sum(outside):,} B). {explanation}")
    # What the tracker can see, it counts exactly
    assert mem.peak_bytes == peak and mem.current_bytes == final
    # and it never sees more than the allocator
    assert mem.peak_bytes <= raw_peak


def test_the_differences_are_the_ones_the_docstring_names(one_thread):
    # exact where nothing is hidden
    run = mlp_step()
    run()
    mem, events = allocator_events(run)
    assert replay(events) == (mem.peak_bytes, mem.current_bytes)
    # out= and resize_: only the wrapped Python numbers (at most 8 bytes each) are missed
    run = out_and_resize()
    mem, events = allocator_events(run)
    outside = unseen_bytes(events, classify(events), "outside ATen ops")
    assert mem.peak_bytes == 8000 * 4 and max(outside) <= 8
    assert 0 < replay(events)[0] - mem.peak_bytes <= sum(outside)
    # convolution: workspaces inside the op push the allocator's peak above the tracker's
    run = conv_step()
    run()
    mem, events = allocator_events(run)
    assert replay(events)[0] > mem.peak_bytes
    assert max(unseen_bytes(events, classify(events), "transient")) >= 1024
    # a checkpoint: two generator states, neither made by an ATen op: the one captured in
    # the forward, and the current one that the recompute puts aside and restores after
    run = checkpointed_dropout_step()
    run()
    mem, events = allocator_events(run)
    assert unseen_bytes(events, classify(events), "outside ATen ops") == [RNG_STATE_BYTES] * 2


# ------------------------------------------------ track_memory(allocator=True) against the replay
def course_step(preset: str, policy: str = "none", batch: int = 4):
    """One forward + backward of a course model (gradients allocated before, as in lesson 7)."""
    cfg = get_config(preset, **({"dropout": 0.0} if preset.startswith("gpt") else {}))
    torch.manual_seed(0)
    m = build_model(cfg, policy).train()
    if preset.startswith("resnet"):
        x = torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size)
        y = torch.randint(0, cfg.num_classes, (batch,))
    else:
        x, y = TextBatches(load_corpus(), batch, cfg.block_size, seed=0).get(0)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    return lambda: m(x, y).backward()


ALLOCATOR_WORKLOADS = {
    "course MLP chain": lambda: course_step("mlp-tiny"),
    "GPT": lambda: course_step("gpt-tiny"),
    "conv net with BatchNorm (ResNet)": lambda: course_step("resnet-tiny"),
    "GPT, every block checkpointed": lambda: course_step("gpt-tiny", "every"),
    "ResNet, every block checkpointed": lambda: course_step("resnet-tiny", "every"),
    "checkpointed MLP with dropout": checkpointed_dropout_step,
}


def run_tracked(run, **options):
    with track_memory(**options) as mem:
        run()
    return mem


@pytest.mark.parametrize("name", list(ALLOCATOR_WORKLOADS))
def test_allocator_peak_equals_the_profilers_replay_and_leaves_the_tracker_alone(name, one_thread):
    run = ALLOCATOR_WORKLOADS[name]()
    run()                                        # warm-up
    plain = run_tracked(run)
    mem = run_tracked(run, allocator=True)
    replayed = profiled_memory(run)              # the profiler alone, no dispatch mode
    raw_peak, _ = replay(allocator_events(run)[1])  # every event as reported, this file's replay
    print(f"\n{name}: tracker peak {mem.peak_bytes:,} B, allocator_peak_bytes "
          f"{mem.allocator_peak_bytes:,} B, the profiler's own replay {replayed.peak_bytes:,} B "
          f"(x{mem.allocator_peak_bytes / mem.peak_bytes:.3f} the tracker); largest transients: "
          + ", ".join(f"{p.op} {p.transient_bytes:,} B" for p in mem.transients(3)))
    # the tracker counts exactly what it counts without the profiler, op by op
    assert mem.peak_bytes == plain.peak_bytes and mem.current_bytes == plain.current_bytes
    assert [(p.op, p.live_bytes, p.phase) for p in mem.timeline] == \
        [(p.op, p.live_bytes, p.phase) for p in plain.timeline]
    # and the allocator's peak is the one the profiler sees without the tracker, within 1%
    assert mem.allocator_peak_bytes == pytest.approx(replayed.peak_bytes, rel=0.01)
    assert mem.allocator_peak_bytes == pytest.approx(raw_peak, rel=0.01)
    assert mem.allocator_peak_bytes >= mem.peak_bytes
    assert mem.allocator_peak_bytes_by_device == {"cpu": mem.allocator_peak_bytes}
    # every point has its allocator level; no op holds the allocator above its peak
    assert all(p.allocator_bytes is not None and p.transient_bytes >= 0 for p in mem.timeline)
    assert max(p.allocator_bytes + p.transient_bytes for p in mem.timeline) \
        <= mem.allocator_peak_bytes


def op_transients_from_the_event_tree(run):
    """(op, transient bytes) of every op the tracker saw that held memory only while it ran,
    found without ckpt_lab's markers: the allocation events under each op in the profiler's
    tree (`seen_op`), their high-water mark above their sum."""
    mem, events = allocator_events(run)
    ops = {}
    for n in events:
        op = seen_op(n)
        if op is not None:
            ops.setdefault((op.start_time_ns, op.name), []).append(n.extra_fields.alloc_size)
    out = []
    for (_, name), sizes in sorted(ops.items()):
        level = high = 0
        for nbytes in sizes:
            level += nbytes
            high = max(high, level)
        if high > level:
            out.append((name[len("aten::"):], high - level))
    return out


def test_each_ops_transient_bytes_match_its_own_events_in_the_profilers_tree(one_thread):
    run = course_step("resnet-tiny")
    run()
    mem = run_tracked(run, allocator=True)
    ours = [(p.op.split(".")[0], p.transient_bytes) for p in mem.timeline if p.transient_bytes]
    assert ours == op_transients_from_the_event_tree(run)
    assert len(ours) >= 10


def test_the_conv_nets_gap_is_convolution_backwards_buffers(one_thread):
    """The allocator's peak sits inside a convolution backward: the tracked bytes then, plus
    what that op allocated and freed inside itself."""
    run = course_step("resnet-tiny")
    run()
    mem = run_tracked(run, allocator=True)
    top = mem.transients(5)
    at_peak = mem.allocator_peak_point()
    print(f"\nconv net: tracker {mem.peak_bytes:,} B, allocator {mem.allocator_peak_bytes:,} B "
          f"(+{mem.allocator_peak_bytes / mem.peak_bytes - 1:.0%}); the allocator peaks in "
          f"{at_peak.op} ({at_peak.phase}, op {at_peak.step}): {at_peak.live_bytes:,} B tracked "
          f"+ {at_peak.transient_bytes:,} B held inside it. Top transients: "
          + "; ".join(f"{p.op} ({p.phase}) {p.transient_bytes:,} B" for p in top))
    assert [p.op for p in top] == ["convolution_backward.default"] * 5
    assert at_peak.op == "convolution_backward.default" and at_peak.phase == "backward"
    assert at_peak.allocator_bytes + at_peak.transient_bytes == mem.allocator_peak_bytes
    assert mem.allocator_peak_bytes - mem.peak_bytes > 0.1 * mem.peak_bytes
    assert mem.peak_with_transients() == mem.allocator_peak_bytes
    assert [p.transient_bytes for p in top] == sorted((p.transient_bytes for p in top),
                                                      reverse=True)


def test_allocator_mode_refuses_a_second_profiler_and_nests_plain_trackers(one_thread):
    with track_memory(allocator=True) as outer:
        a = torch.ones(1000)
        with track_memory() as inner:          # a plain tracker inside: fine
            b = torch.ones(500)
        with pytest.raises(RuntimeError, match="only one runs at a time"):
            with track_memory(allocator=True):
                pass
        del a, b
    assert inner.peak_bytes == 2000 and outer.peak_bytes == 6000
    assert outer.allocator_peak_bytes == 6000
    with profile(activities=[ProfilerActivity.CPU]):
        with pytest.raises(RuntimeError, match="already recording"):
            with track_memory(allocator=True):
                pass
    with pytest.raises(ValueError, match="allocator=True"):
        inner.transients()


def test_a_resize_holds_both_storages_for_a_moment():
    # growing a storage allocates the new one, copies, then frees the old: for that moment
    # the allocator holds both, which the tracker (counting what is left) does not see
    with track_memory(allocator=True) as mem:
        c = torch.empty(1000)
        c.resize_(3000)
    (point,) = [p for p in mem.timeline if p.op.startswith("resize_")]
    assert point.live_bytes == point.allocator_bytes == 12000
    assert point.transient_bytes == 4000
    assert mem.allocator_peak_bytes == 16000 and mem.peak_bytes == 12000
    del c


def test_a_free_of_a_block_allocated_before_the_block_is_left_out():
    # The CPU allocator reports such a free with no size, or with the stale size of an earlier
    # profiled block at the same address; the replay leaves it out, as the tracker does.
    before = torch.empty(1000)
    with track_memory(allocator=True) as mem:
        before.resize_(3000)
    (point,) = mem.timeline
    assert point.live_bytes == 8000                # the growth
    assert point.allocator_bytes == 12000          # the new block; the old one's free left out
    assert point.transient_bytes == 0 and mem.allocator_peak_bytes == 12000
    del before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocator_peak_and_op_levels_match_torch_cuda_statistics():
    """On CUDA the profiler's events carry the caching allocator's rounded blocks: their
    replay must equal memory_allocated / max_memory_allocated read at every op boundary."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class StatsAtOps(TorchDispatchMode):
        def __init__(self, start):
            super().__init__()
            self.start, self.rows = start, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            after = torch.cuda.memory_allocated() - self.start
            high = torch.cuda.max_memory_allocated() - self.start
            self.rows.append((func.__name__, after, high - after))
            return out

    torch.manual_seed(0)
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    x = torch.randn(64, 1024, device="cuda")

    def step():
        (x @ w).softmax(-1).sum().backward()
        w.grad = None
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    with track_memory(allocator=True) as mem:
        step()
    assert mem.allocator_peak_bytes_by_device["cuda:0"] == torch.cuda.max_memory_allocated() - start
    stats = StatsAtOps(torch.cuda.memory_allocated())
    with stats:
        step()
    ours = [(p.op, p.allocator_bytes, p.transient_bytes) for p in mem.timeline]
    assert ours == stats.rows


def test_allocator_mode_drops_the_profilers_trace_lines_and_nothing_else(capfd):
    # libkineto writes "USDT: ... profiler_start/stop" to fd 2, which Jupyter shows under a cell
    with track_memory(allocator=True) as mem:
        torch.ones(10)
    assert "USDT" not in capfd.readouterr().err and mem.allocator_peak_bytes == 40
    from ckpt_lab.measure.allocator import without_trace_lines
    with without_trace_lines():
        os.write(2, b"USDT:2026 x.cpp:52] profiler_start\nan error the user must see\n")
    assert capfd.readouterr().err == "an error the user must see\n"
