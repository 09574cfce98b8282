"""PyTorch's selective API, save_on_cpu, torch.compile's memory budget and memory snapshots,
each beside ckpt_lab's counterpart and measured with lesson 11's helpers (`stack`, `compiled`)."""
import contextlib
import functools
import pickle

import pytest
import torch
from torch import nn
from torch.cuda import _memory_viz
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ckpt_lab import checkpoint, formulas, offload_activations, track_memory
from ckpt_lab.lessons import compiled, stack
from ckpt_lab.training.models import Block, GPTConfig
from ckpt_lab.measure.snapshot import (cuda_snapshot, record_allocations, save_snapshot,
                               trace_peak_bytes)


@pytest.fixture(autouse=True)
def _one(one_thread):
    yield


def block(attn_impl="manual", dropout=0.1):
    torch.manual_seed(0)
    return Block(GPTConfig(n_embd=32, n_head=2, block_size=64, dropout=dropout,
                           attn_impl=attn_impl))


X = torch.randn(2, 64, 32, generator=torch.Generator().manual_seed(1))


def _save_matmuls(ctx, op, *args, **kwargs):
    """Lesson 11's policy: keep what matrix multiplies produce, recompute the rest."""
    mm = op.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
    return CheckpointPolicy.MUST_SAVE if mm else CheckpointPolicy.PREFER_RECOMPUTE


def test_torch_selective_api_matches_save_matmuls_bytes_gradients_and_flops():
    b = block()
    context = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
    ways = {"plain": b,
            "full": lambda t: checkpoint(b, t),
            "ours": lambda t: checkpoint(b, t, policy="save_matmuls"),
            "theirs": lambda t: torch.utils.checkpoint.checkpoint(b, t, use_reentrant=False,
                                                                  context_fn=context)}
    r = {k: stack.measure(k, way, b, X) for k, way in ways.items()}
    plain, full, ours, theirs = r["plain"], r["full"], r["ours"], r["theirs"]
    assert all(stack.same(plain, m) for m in r.values())          # dropout included
    assert plain.kept_bytes == formulas.gpt_block_bytes(2, 64, 32, 2)
    assert ours.kept_bytes == theirs.kept_bytes
    assert full.kept_bytes < ours.kept_bytes < plain.kept_bytes
    assert ours.flops == theirs.flops == plain.flops < full.flops
    # full recomputation re-runs the forward: a third more FLOPs (forward F, backward 2F)
    assert full.flops - plain.flops == plain.flops // 3


def test_fused_attention_leaves_selective_recomputation_nothing_to_free():
    manual = stack.attention_core_saving(block("manual", 0.0), X)
    fused = stack.attention_core_saving(block("sdpa", 0.0), X)
    freed = {k: r["plain"].kept_bytes - r["attention core recomputed"].kept_bytes
             for k, r in (("manual", manual), ("sdpa", fused))}
    t2 = 2 * 2 * 64 * 64 * 4           # one (B, heads, T, T) fp32 tensor
    assert freed["manual"] >= t2        # the scores and the softmax go
    assert freed["sdpa"] < t2 // 8      # only the kernel's log-sum-exp rows go
    for r in (manual, fused):
        assert stack.same(r["plain"], r["attention core recomputed"])
        assert r["attention core recomputed"].flops > r["plain"].flops


def test_cpu_sdpa_with_dropout_keeps_the_scores_again():
    """On CPU, SDPA with dropout has no fused kernel: the math path stores the T x T tensors."""
    fused = stack.measure("plain", block("sdpa", 0.0), block("sdpa", 0.0), X).kept_bytes
    dropped = stack.measure("plain", block("sdpa", 0.1), block("sdpa", 0.1), X).kept_bytes
    assert dropped - fused >= 2 * 2 * 64 * 64 * 4        # at least one (B, heads, T, T) fp32 tensor


def test_cpu_fused_attention_flops_are_counted():
    fused = stack.measure("plain", block("sdpa", 0.0), block("sdpa", 0.0), X)
    manual = stack.measure("plain", block("manual", 0.0), block("manual", 0.0), X)
    # the fused backward recomputes the scores q k^T (it never stored them): one more matmul
    assert fused.flops - manual.flops == 2 * 2 * 2 * 64 * 64 * 16


def _offloads(model, x, pin_memory=False):
    """Bytes and tensors each offload sends to the host in one step of model(x)."""
    with stack.counting_save_on_cpu(pin_memory=pin_memory) as theirs:
        model(x).pow(2).sum().backward()
    model.zero_grad(set_to_none=True)
    with offload_activations() as ours:
        loss = model(x).pow(2).sum()
    loss.backward()
    return theirs, ours


def test_save_on_cpu_copies_weights_and_views_ckpt_lab_offload_does_not():
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(32, 32), nn.GELU())])
    theirs, ours = _offloads(model, torch.randn(16, 32))
    act, weight = 16 * 32 * 4, 32 * 32 * 4
    # ckpt_lab: every storage the forward made, once (3 Linear + 3 GELU outputs)
    assert (ours.bytes_offloaded, ours.storages) == (6 * act, 6)
    # save_on_cpu: every saved tensor, the input batch x and the weights the 2nd and 3rd
    # Linear keep for their input gradient included (x needs none, so the 1st keeps no weight)
    assert theirs.tensors == 9
    assert theirs.bytes_copied == ours.bytes_offloaded + act + 2 * weight


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_offload_device_peaks_on_cuda():
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.GELU())]).cuda()
    x = torch.randn(4096, 512, device="cuda")

    def peak(ctx):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with ctx:
            y = model(x).pow(2).sum()
        y.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    plain = peak(contextlib.nullcontext())
    assert peak(torch.autograd.graph.save_on_cpu(pin_memory=True)) < plain
    assert peak(offload_activations()) < plain


def _mlp(depth=3, width=64):
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])


def test_compile_budget_sweep_keeps_less_as_the_budget_falls():
    import torch._functorch.config as fc
    x = torch.randn(256, 64)
    kept = []
    for budget in (1.0, 0.5, 0.0):
        torch._dynamo.reset()
        model = _mlp()
        fast = torch.compile(model, backend="aot_eager_decomp_partition")
        with fc.patch(activation_memory_budget=budget):
            fast(x).pow(2).mean().backward()
        kept.append(compiled.measure_step(fast, model, x, repeats=1).kept_bytes)
    torch._dynamo.reset()
    assert kept[0] > kept[1] > kept[2]
    act = 256 * 64 * 4
    assert 6 * act <= kept[0] <= 6 * act + 4 and kept[2] <= 2 * act   # + the held loss scalar


def test_each_variant_needs_its_own_code_for_its_own_budget():
    """Dynamo keeps graphs on the code it traces and does not guard on the budget: a second
    compile of one function reuses the first one's graph; `compiled.own_code` compiles anew."""
    import torch._functorch.config as fc
    model, x = _mlp(), torch.randn(256, 64)

    def loss(m, t):
        return m(t).pow(2).mean()

    def variants(copy):
        out = {}
        for budget in (1.0, 0.0):
            fast = torch.compile(compiled.own_code(loss) if copy else loss,
                                 backend="aot_eager_decomp_partition")

            def forward(fast=fast, budget=budget):
                with fc.patch(activation_memory_budget=budget):
                    return fast(model, x)
            out[budget] = (forward, model)
        return out

    kept = {}
    for copy in (False, True):
        torch._dynamo.reset()
        rows = compiled.compare(variants(copy), repeats=1, warmup=0)
        kept[copy] = [rows[b]["kept_bytes"] for b in (1.0, 0.0)]
        assert [rows[b]["graphs"] for b in (1.0, 0.0)] == ([1, 0] if not copy else [1, 1])
    torch._dynamo.reset()
    assert kept[False][0] == kept[False][1]            # budget 0.0 ran budget 1.0's graph
    assert kept[True][0] > kept[True][1]


def test_a_low_budget_reruns_the_forward_before_the_backward_starts():
    """compiled.partition reads the partitioner's graphs: at 1.0 nothing is recomputed and the
    forward saves what the allocator sees it keep; at 0.1 the backward re-runs most matmuls,
    many before its first gradient matmul (lesson 11's reason the peak rises)."""
    import torch.nn.functional as F
    from ckpt_lab.training.models import build_model, get_config
    cfg = get_config("gpt-tiny", dropout=0.0)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(0))

    def loss(model, idx):
        h = model.chain[0](idx)
        for b in model.chain[1:-1]:
            h = b(h)
        return F.cross_entropy(model.chain[-1](h).flatten(0, 1), idx.flatten())

    torch._dynamo.reset()
    full, low = (compiled.partition(loss, (build_model(cfg), idx), b) for b in (1.0, 0.1))
    model = build_model(cfg)
    fast = torch.compile(compiled.own_code(loss), backend="aot_eager_decomp_partition")
    fast(model, idx).backward()
    kept = compiled.measure(lambda: fast(model, idx), model, warmup=0)["kept_bytes"]
    torch._dynamo.reset()
    assert full["recomputed_matmuls"] == full["recomputed_before_first_gradient"] == 0
    assert full["saved_bytes"] <= kept <= full["saved_bytes"] + 16      # + the held loss
    assert low["saved_bytes"] < full["saved_bytes"] / 2
    assert low["recomputed_matmuls"] > full["forward_matmuls"] / 2
    assert 0 < low["recomputed_before_first_gradient"] <= low["recomputed_matmuls"]


def test_track_memory_does_not_see_the_compiled_program():
    """Under a TorchDispatchMode torch.compile runs the module eagerly: the tracker sees the
    eager ops and the eager bytes, whatever the budget."""
    import torch._functorch.config as fc
    torch._dynamo.reset()
    model = _mlp()
    x = torch.randn(256, 64)
    eager = track_memory()
    with eager as plain:
        model(x).sum()
    c = torch.compile(model, backend="aot_eager_decomp_partition")
    with fc.patch(activation_memory_budget=0.0):
        c(x).sum().backward()
    with track_memory() as mem:
        c(x).sum()
    assert "addmm" in {p.op.split(".")[0] for p in mem.timeline}
    assert mem.peak_bytes == plain.peak_bytes
    torch._dynamo.reset()


def test_profiled_memory_sees_allocations():
    held = []
    m = compiled.profiled_memory(lambda: held.append(torch.ones(1024, 1024).sum()))
    assert m.peak_bytes >= 4 * 2 ** 20 and 0 < m.end_bytes < 1024


def test_exported_timeline_loads_in_pytorchs_visualizer(tmp_path):
    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(32, 64, requires_grad=True)
    with track_memory() as mem, record_allocations() as trace:
        y = checkpoint(model, x).pow(2).sum()
        y.backward()
        del y
    snap = trace.snapshot()
    assert trace.peak_bytes() == trace_peak_bytes(snap) == mem.peak_bytes
    path = tmp_path / "snapshot.pickle"
    save_snapshot(snap, path)
    data = pickle.loads(path.read_bytes())
    text = _memory_viz.trace(data)
    assert "recompute" in _memory_viz.memory(data, format_flamegraph=lambda s: s) or \
        any("recompute" in e["frames"][0]["name"] for e in data["device_traces"][0])
    assert text.count("free completed") == sum(
        e["action"] == "free_completed" for e in data["device_traces"][0])
    assert "total_allocated" in _memory_viz.segsum(data)     # checks the segment accounting
    assert "snapshot.pickle" in _memory_viz.trace_plot(data)
    assert "snapshot.pickle" in _memory_viz.segment_plot(data)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_real_cuda_snapshot_has_the_same_shape():
    model = _mlp().cuda()
    x = torch.randn(256, 64, device="cuda", requires_grad=True)
    snap = cuda_snapshot(lambda: checkpoint(model, x).pow(2).sum().backward())
    assert snap["segments"] and any(snap["device_traces"])
    assert trace_peak_bytes(snap, torch.cuda.current_device()) > 0
    assert "snapshot.pickle" in _memory_viz.trace_plot(snap)
