"""Selective checkpointing against a plain run and PyTorch's own selective checkpointing."""
import functools

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ckpt_lab import CheckpointError, checkpoint, checkpoint_sequential, track_memory
from ckpt_lab.checkpoint.selective import POLICIES, Decision, save_matmuls
from oracle import same

IMPLS = ["hooks", "reentrant"]
aten = torch.ops.aten


def block(width, p=0.2):
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(p),
                         nn.Linear(4 * width, width), nn.Tanh())


def blocks(n=3, width=16, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(block(width) for _ in range(n))


def torch_sac(policy):
    """PyTorch's selective checkpoint driven by one of our bool policies."""
    def pt_policy(ctx, op, *args, **kwargs):
        return (tuc.CheckpointPolicy.MUST_SAVE if policy(op, *args, **kwargs)
                else tuc.CheckpointPolicy.PREFER_RECOMPUTE)

    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, pt_policy)
    return lambda b, y: tuc.checkpoint(b, y, use_reentrant=False, context_fn=context_fn)


def run(model, x, step, seed=7):
    """Gradients (input first) and peak bytes of forward+backward with `step` per block."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    with track_memory() as mem:
        y = x
        for b in model:
            y = step(b, y)
        y.pow(2).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()], mem.peak_bytes


class OpCounter(TorchDispatchMode):
    """Counts how often each ATen op really runs."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket] = self.counts.get(func.overloadpacket, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("impl", IMPLS)
def test_save_matmuls_bitwise_equal_to_plain_and_torch_with_dropout(impl):
    m, x = blocks(), torch.randn(8, 16)
    ref, _ = run(m, x, lambda b, y: b(y))
    ours, _ = run(m, x, lambda b, y: checkpoint(b, y, impl=impl, policy="save_matmuls"))
    oracle, _ = run(m, x, torch_sac(save_matmuls))
    assert same(ref, ours)
    assert same(oracle, ours)


@pytest.mark.parametrize("policy", [
    lambda op, *a, **k: Decision.SAVE if op is aten.addmm.default else Decision.RECOMPUTE,
    [aten.addmm],
    {aten.gelu.default, aten.tanh.default},
    "recompute_all",
])
def test_other_policy_forms_are_exact(policy):
    m, x = blocks(2), torch.randn(8, 16)
    ref, _ = run(m, x, lambda b, y: b(y))
    assert same(ref, run(m, x, lambda b, y: checkpoint(b, y, policy=policy))[0])


def test_saved_matmuls_are_not_recomputed():
    m, x = blocks(3), torch.randn(8, 16)
    counts = {}
    for name, step in [("plain", lambda b, y: b(y)), ("full", lambda b, y: checkpoint(b, y)),
                       ("save_matmuls", lambda b, y: checkpoint(b, y, policy="save_matmuls"))]:
        with OpCounter() as c:
            run(m, x, step)
        counts[name] = c.counts
    # 3 blocks x 2 Linear = 6 addmm in the forward; a full checkpoint runs them twice.
    assert counts["plain"][aten.addmm] == 6
    assert counts["full"][aten.addmm] == 12
    assert counts["save_matmuls"][aten.addmm] == 6
    assert counts["save_matmuls"][aten.gelu] == counts["full"][aten.gelu] == 6


def test_attention_matmuls_saved_exactly():
    torch.manual_seed(0)
    wq, wk, wv = (torch.randn(16, 16, requires_grad=True) for _ in range(3))

    def attn(x):
        q, k, v = (x @ w for w in (wq, wk, wv))
        heads = [t.view(2, 8, 2, 8).transpose(1, 2) for t in (q, k, v)]
        o = F.scaled_dot_product_attention(*heads, dropout_p=0.3)
        return o.transpose(1, 2).reshape(2, 8, 16).sin()

    def grads(step):
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        for w in (wq, wk, wv):
            w.grad = None
        torch.manual_seed(3)
        step(x).sum().backward()
        return [x.grad, wq.grad, wk.grad, wv.grad]

    ref = grads(attn)
    assert same(ref, grads(lambda x: checkpoint(attn, x, policy="save_matmuls")))
    assert same(ref, grads(lambda x: torch_sac(save_matmuls)(attn, x)))


def test_peak_matches_torch_selective_checkpoint():
    torch.manual_seed(0)
    m, x = blocks(4, width=32), torch.randn(512, 32)
    _, plain = run(m, x, lambda b, y: b(y))
    _, full = run(m, x, lambda b, y: checkpoint(b, y))
    _, ours = run(m, x, lambda b, y: checkpoint(b, y, policy="save_matmuls"))
    _, oracle = run(m, x, torch_sac(save_matmuls))
    assert abs(ours - oracle) <= 0.01 * oracle
    assert full < ours < plain


def test_saved_random_op_keeps_gradients_exact():
    # The policy asks to save a random op; it is recomputed anyway (the replayed generator
    # draws the same numbers) so the dropout after it still draws the forward's mask.
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)

    def fn(x):
        a = x @ w
        a = a * torch.bernoulli(torch.full_like(a, 0.5))
        return F.dropout(a, 0.5, training=True).sin()

    def grads(step):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        w.grad = None
        torch.manual_seed(3)
        step(x).sum().backward()
        return [x.grad, w.grad]

    saves_random = [aten.bernoulli, aten.mm]
    assert same(grads(fn), grads(lambda x: checkpoint(fn, x, policy=saves_random)))


def test_policy_works_with_checkpoint_sequential_and_kwargs():
    m, x = blocks(4), torch.randn(8, 16)
    whole = nn.ModuleList([nn.Sequential(*m)])
    ref, _ = run(whole, x, lambda b, y: b(y))
    ours, _ = run(whole, x, lambda b, y: checkpoint_sequential(b, y, segments=2,
                                                                policy="save_matmuls"))
    assert same(ref, ours)

    def scaled(y, scale):
        return m[0][:2](y) * scale
    g = torch.randn(8, 16, requires_grad=True)
    checkpoint(scaled, g, scale=3.0, policy="save_matmuls").sum().backward()
    expected = torch.autograd.grad(scaled(g, scale=3.0).sum(), g)[0]
    assert torch.equal(g.grad, expected)


def test_saved_output_modified_in_place_is_refused():
    w = torch.randn(4, 4, requires_grad=True)

    def fn(x):
        y = x @ w
        y.relu_()
        return y.sin()

    out = checkpoint(fn, torch.randn(2, 4, requires_grad=True), policy="save_matmuls")
    with pytest.raises(CheckpointError, match="modified in place"):
        out.sum().backward()


def test_second_backward_is_refused():
    m = blocks(1)
    out = checkpoint(m[0], torch.randn(2, 16, requires_grad=True), policy="save_matmuls")
    out.sum().backward(retain_graph=True)
    with pytest.raises(CheckpointError, match="only once"):
        out.sum().backward()


def test_bad_policies_get_clear_errors():
    x = torch.randn(2, 16, requires_grad=True)
    m = blocks(1)[0]
    with pytest.raises(ValueError, match="save_matmuls"):
        checkpoint(m, x, policy="save_everything")
    with pytest.raises(ValueError, match="callable"):
        checkpoint(m, x, policy=3)
    with pytest.raises(ValueError, match="ATen ops"):
        checkpoint(m, x, policy=["mm"])
    with pytest.raises(TypeError, match="True/False"):
        checkpoint(m, x, policy=lambda op, *a, **k: "save")
    assert set(POLICIES) >= {"save_matmuls", "recompute_all"}


def test_without_grad_policy_is_validated_and_fn_runs_plainly():
    m, x = blocks(1)[0].eval(), torch.randn(2, 16)
    with torch.no_grad():
        assert torch.equal(checkpoint(m, x, policy="save_matmuls"), m(x))
        with pytest.raises(ValueError):
            checkpoint(m, x, policy="nope")


def test_policy_that_reads_the_op_alone_is_asked_once_per_op():
    asked = []

    def counting(op, *args, **kwargs):
        asked.append(op)
        return op.overloadpacket in (aten.addmm,)

    m, x = blocks(2), torch.randn(8, 16)
    ref, _ = run(m, x, lambda b, y: b(y))
    per_call, _ = run(m, x, lambda b, y: checkpoint(b, y, policy=counting))
    calls = len(asked)
    counting.by_op_only = True   # what save_matmuls, recompute_all and op collections carry
    asked.clear()
    per_op, _ = run(m, x, lambda b, y: checkpoint(b, y, policy=counting))
    assert same(ref, per_call) and same(ref, per_op)
    # 2 blocks x (2 addmm, gelu, tanh, mul, ...): asked for every call, then once per op a block
    assert calls > len(asked) and len(asked) == len(set(asked)) * 2
    assert save_matmuls.by_op_only and POLICIES["recompute_all"].by_op_only


def test_benchmark_rows_give_the_gradients_and_peak_of_their_torch_twins(one_thread):
    # The rows bench_train times: ckpt_lab's selective (attention core) and save_matmuls per
    # block beside PyTorch's selective checkpointing told to save the same ops. Dropout on.
    from benchmarks.bench_train import POLICIES as ROWS, TORCH_SAC, _build
    from ckpt_lab.training.data import TextBatches, load_corpus
    from ckpt_lab.training.models import get_config
    cfg = get_config("gpt-tiny")
    x, y = TextBatches(load_corpus(), 2, cfg.block_size, seed=0).get(0)

    def step(name):
        model = _build(cfg, name).train()
        torch.manual_seed(5)
        with track_memory() as mem:
            model(x, y).backward()
        return [p.grad for p in model.parameters()], mem.peak_bytes

    plain, plain_peak = step("none")
    for name in ("selective", "save_matmuls"):
        ours, ours_peak = step(name)
        theirs, theirs_peak = step(f"{name} {TORCH_SAC}")
        assert same(plain, ours) and same(plain, theirs), name
        assert ours_peak == theirs_peak < plain_peak, name
    assert {"selective", "save_matmuls"} <= set(ROWS)
