"""The correctness catalogue (``ckpt_lab.checkpoint.cases``, the one lesson 2 draws): ckpt_lab
gives plain autograd's result or a CheckpointError naming cause and fix, in both designs;
PyTorch's outcome is pinned for the torch this course pins (2.13), as lesson 2's grid shows. Also: the fingerprint raises no false
alarm on any of them, the parameter search does not depend on how the function holds a module,
and PyTorch's selective-checkpoint contexts run unchanged.
"""
import functools
import re
import types

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import CheckpointError, checkpoint, track_memory

from ckpt_lab.checkpoint.cases import (CASES, LESSON_ROWS, REFUSES, RIGHT, WRONG, Case,
                                         outcome, reference)
from oracle import same

FAST = [c for c in CASES if not c.slow]
OURS = ["ckpt_lab hooks", "ckpt_lab reentrant"]
THEIRS = ["torch non-reentrant", "torch reentrant"]
IMPLS = ["hooks", "reentrant"]


def ids(case: Case) -> str:
    return f"{case.cls}-{case.name}"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_more_than_one_case_per_class():
    counts = {k: sum(c.cls == k for c in CASES) for k in range(1, 12)}
    assert all(n >= 2 for n in counts.values()), counts


def test_lesson_2_shows_its_six_faults_and_one_case_per_class():
    assert [c.cls for c in LESSON_ROWS] == [0] * 6 + list(range(1, 8))
    assert len({c.name for c in CASES}) == len(CASES)


def test_every_refusal_of_ckpt_lab_has_a_message_to_match():
    assert all(c.refusal for c in CASES for d in OURS if c.expected[d] == REFUSES)


@pytest.mark.parametrize("design", OURS)
@pytest.mark.parametrize("case", FAST, ids=ids)
def test_ckpt_lab_is_right_or_refuses_with_cause_and_fix(case, design):
    label, detail = outcome(case, design)
    assert label != WRONG
    assert label == case.expected[design], detail
    if label == REFUSES:
        assert isinstance(detail, CheckpointError), detail
        assert re.search(case.refusal, str(detail), re.S), str(detail)


@pytest.mark.skipif(torch.__version__ >= "2.14", reason="PyTorch's outcomes pinned for 2.13")
@pytest.mark.parametrize("design", THEIRS)
@pytest.mark.parametrize("case", FAST, ids=ids)
def test_torch_outcome_is_the_recorded_one(case, design):
    assert outcome(case, design)[0] == case.expected[design]


def test_torch_is_silently_wrong_where_ckpt_lab_is_not():
    """The opening: cases where PyTorch's checkpoint (either design) is silently wrong."""
    wrong = {c.name for c in FAST if WRONG in (c.expected[d] for d in THEIRS)}
    assert len(wrong) >= 15 and all(WRONG not in (c.expected[d] for d in OURS) for c in CASES)


@pytest.mark.parametrize(("case", "impl"), [(c, i) for c in FAST for i in IMPLS
                                             if c.expected[f"ckpt_lab {i}"] == RIGHT],
                         ids=lambda v: ids(v) if isinstance(v, Case) else v)
def test_the_fingerprint_raises_no_false_alarm(case, impl):
    """determinism_check="fingerprint" on every case that is right: still right (batch norm's
    statistics and spectral norm's vectors are saved, changed by the forward and replayed)."""
    ref = reference(case)
    got = case.run(lambda fn, *a: checkpoint(fn, *a, impl=impl, determinism_check="fingerprint"))
    assert same(ref, got)


@pytest.mark.parametrize("early_stop", [True, False])
def test_the_fingerprint_skips_a_buffer_an_op_fills_after_saving_it(early_stop):
    """RReLU saves its noise buffer unfilled: its value at save time is garbage both times."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.RReLU(), nn.Linear(16, 16), nn.RReLU())
    x = torch.randn(32, 16, requires_grad=True)

    def grads(run):
        net.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(1)
        run().sum().backward()
        return [x.grad] + [p.grad for p in net.parameters()]

    plain = grads(lambda: net(x))
    for impl in IMPLS:
        kw = {"early_stop": early_stop} if impl == "hooks" else {}
        assert same(plain, grads(lambda: checkpoint(net, x, impl=impl,
                                                    determinism_check="fingerprint", **kw)))


class Deep:
    """Holds a module two plain objects deep, where the module search does not look."""

    def __init__(self, lin):
        self.inner = types.SimpleNamespace(lin=lin)


@pytest.mark.parametrize("impl", IMPLS)
def test_parameters_are_found_through_the_graph_however_the_function_holds_them(impl):
    """The forward's graph names every leaf it read: an optimizer step on a parameter the
    module search cannot reach is refused, and backward(inputs=[p]) reaches it."""
    torch.manual_seed(0)
    deep = Deep(nn.Linear(6, 6))
    lin = deep.inner.lin
    x = torch.randn(3, 6, requires_grad=True)
    f = lambda t: torch.tanh(deep.inner.lin(t)) + deep.inner.lin.bias  # noqa: E731
    from ckpt_lab.checkpoint.hidden_inputs import modules_of
    assert modules_of(f, []) == []                 # the module search does not see it
    ref = torch.autograd.grad(f(x).sum(), [lin.bias])
    loss = checkpoint(f, x, impl=impl).sum()
    loss.backward(inputs=[lin.bias])
    assert same(list(ref), [lin.bias.grad])
    loss = checkpoint(f, x, impl=impl).sum()
    with torch.no_grad():
        lin.bias.add_(1)                               # a bias: no operation saves it
    with pytest.raises(CheckpointError, match="requires grad and that the function reads.*"
                                              "Call backward before changing the weights"):
        loss.backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_norm_counts_once_under_nested_checkpoints(impl):
    """checkpoint_recursive nests checkpoints: the outer recompute runs the inner forwards
    again, which must update copies of the statistics, not the module's."""
    from ckpt_lab import checkpoint_recursive

    def chain():
        torch.manual_seed(0)
        return [nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh()) for _ in range(6)]

    plain, ours = chain(), chain()
    x = torch.randn(16, 8)

    def grads(layers, run):
        leaf = x.detach().requires_grad_()
        run(layers, leaf).square().sum().backward()
        return [leaf.grad] + [p.grad for m in layers for p in m.parameters()]

    def sequential(layers, t):
        for m in layers:
            t = m(t)
        return t

    ref = grads(plain, sequential)
    got = grads(ours, lambda layers, t: checkpoint_recursive(layers, t, impl=impl))
    assert same(ref, got)
    assert same([b for m in plain for b in m.buffers()], [b for m in ours for b in m.buffers()])


def test_reentrant_refuses_a_captured_tensor_with_a_history():
    """A non-leaf the function captures (not an argument) cannot be given a gradient by a
    reentrant node: refused, where torch's reentrant checkpoint drops its gradient."""
    w = torch.randn(4, requires_grad=True)
    h = w * 2                                          # has a history outside the checkpoint
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(CheckpointError, match=r"history outside the checkpoint \(the output of "
                                              r"mul\).*Pass it as an argument"):
        checkpoint(lambda t: t * h, x, impl="reentrant")
    torch.autograd.grad(checkpoint(lambda t: t * h, x, impl="hooks").sum(), [w])


def test_reentrant_refuses_differentiating_inside_its_forward():
    x = torch.randn(5, requires_grad=True)

    def f(t):
        y = t.sin()
        return torch.autograd.grad(y.sum(), t, create_graph=True)[0]

    with pytest.raises(CheckpointError, match="keeps nothing.*impl='hooks'"):
        checkpoint(f, x, impl="reentrant")


# ------------------------------------------------------------- PyTorch's selective contexts
def _block():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 32),
                         nn.Tanh())


def _save_matmuls(ctx, op, *args, **kwargs):
    keep = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return tuc.CheckpointPolicy.MUST_SAVE if keep else tuc.CheckpointPolicy.PREFER_RECOMPUTE


POLICIES = {
    "policy function": _save_matmuls,
    "list of ops": [torch.ops.aten.addmm.default],
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_torch_selective_contexts_run_unchanged(policy):
    """context_fn from create_selective_checkpoint_contexts: gradients bitwise equal to plain
    and to torch's selective checkpoint, and the same bytes kept after the forward and at the
    peak (track_memory), in the hooks design; the reentrant design gives the same gradients."""
    model = _block()
    x = torch.randn(16, 32)
    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, POLICIES[policy])

    def measure(run):
        model.zero_grad(set_to_none=True)
        leaf = x.detach().requires_grad_()
        torch.manual_seed(1)
        with track_memory() as mem:
            out = run(leaf)
            kept = mem.current_bytes
            out.square().sum().backward()
        return [leaf.grad] + [p.grad for p in model.parameters()], kept, mem.peak_bytes

    plain, plain_kept, _ = measure(model)
    theirs, their_kept, their_peak = measure(lambda t: tuc.checkpoint(
        model, t, use_reentrant=False, context_fn=context_fn))
    ours, our_kept, our_peak = measure(lambda t: checkpoint(model, t, context_fn=context_fn))
    reentrant = measure(lambda t: checkpoint(model, t, impl="reentrant", context_fn=context_fn))
    plain_ckpt_kept = measure(lambda t: checkpoint(model, t))[1]
    assert same(plain, ours) and same(theirs, ours) and same(plain, reentrant[0])
    assert (our_kept, our_peak) == (their_kept, their_peak)
    assert plain_ckpt_kept < our_kept < plain_kept      # the matmul outputs are kept


def test_policy_and_context_fn_are_one_or_the_other():
    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, _save_matmuls)
    with pytest.raises(ValueError, match="not both"):
        checkpoint(_block(), torch.randn(2, 32), policy="save_matmuls", context_fn=context_fn)


# ----------------------------------------- a closure over a whole model: only what ran is watched
class _BlocksWithBatchNorm(nn.Module):
    """Three blocks with batch norm, each checkpointed through a closure over the whole model
    (how models often call a checkpoint from their own forward)."""

    def __init__(self, impl=None, late_binding=False):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())
                                    for _ in range(3))
        self.impl, self.late_binding = impl, late_binding

    def forward(self, h):
        for i in range(3):
            if self.impl is None:
                h = self.blocks[i](h)
            elif self.late_binding:          # the classic bug: i is read when the lambda runs
                h = checkpoint(lambda t: self.blocks[i](t), h, impl=self.impl)
            else:
                h = checkpoint(lambda t, i=i: self.blocks[i](t), h, impl=self.impl)
        return h


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_later_blocks_updating_their_statistics_do_not_trip_an_earlier_checkpoint(impl):
    torch.manual_seed(0)
    plain = _BlocksWithBatchNorm()
    ours = _BlocksWithBatchNorm(impl)
    ours.load_state_dict(plain.state_dict())
    grads = []
    for model in (plain, ours):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).requires_grad_()
        model(x).square().sum().backward()
        grads.append([x.grad] + [p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert [int(b[1].num_batches_tracked) for b in ours.blocks] == [1, 1, 1]


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_a_lambda_that_reads_its_loop_variable_late_is_refused(impl):
    """The recompute would run the last block, not the one the forward ran: torch's checkpoint
    computes that gradient silently; ckpt_lab sees another parameter object and refuses."""
    torch.manual_seed(0)
    model = _BlocksWithBatchNorm(impl, late_binding=True)
    with pytest.raises(CheckpointError):
        model(torch.randn(16, 8, requires_grad=True)).sum().backward()
