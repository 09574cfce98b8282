"""What no checkpoint can make exact, each shown, with the way around it.

The recompute re-runs the function; anything it reads that the checkpoint cannot capture and
replay can differ the second time. By default ckpt_lab, like PyTorch, then returns other
gradients; ``determinism_check="fingerprint"`` compares every recomputed tensor with the
forward's bit for bit and refuses instead. Batch norm's running statistics, once on this list,
are now replayed (``ckpt_lab.checkpoint.module_state``). These tests pin the behaviour the docstring of
``ckpt_lab.checkpoint`` and lesson 2 describe.
"""
import threading

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import CheckpointError, checkpoint
from ckpt_lab.training.models import RecomputeSafeBatchNorm2d

RUNS = {
    "ckpt_lab hooks": lambda f, *a: checkpoint(f, *a, impl="hooks"),
    "ckpt_lab reentrant": lambda f, *a: checkpoint(f, *a, impl="reentrant"),
    "torch non-reentrant": lambda f, *a: tuc.checkpoint(f, *a, use_reentrant=False),
}


def grad_of(run, x, *args):
    x = x.detach().requires_grad_()
    run(x, *args).square().sum().backward()
    return x.grad


# --------------------------------------------------------------------- a custom generator
HIDDEN = torch.Generator()


def noise_from_hidden_generator(x):
    return x * torch.bernoulli(torch.full_like(x, 0.5), generator=HIDDEN)


def noise_from(x, g):
    return x * torch.bernoulli(torch.full_like(x, 0.5), generator=g)


@pytest.mark.parametrize("name", list(RUNS))
def test_a_generator_the_function_finds_by_itself_is_not_replayed(name):
    x = torch.randn(256)
    HIDDEN.manual_seed(0)
    plain = grad_of(noise_from_hidden_generator, x)
    HIDDEN.manual_seed(0)
    ckpt = grad_of(lambda t: RUNS[name](noise_from_hidden_generator, t), x)
    assert not torch.equal(plain, ckpt)        # silently another mask in the recompute


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_the_fingerprint_refuses_what_a_hidden_generator_changes(impl):
    x = torch.randn(256)
    HIDDEN.manual_seed(0)
    with pytest.raises(CheckpointError, match="fingerprint differs.*pass it as an argument"):
        grad_of(lambda t: checkpoint(noise_from_hidden_generator, t, impl=impl,
                                     determinism_check="fingerprint"), x)


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_a_generator_passed_as_an_argument_is_replayed(impl):
    x = torch.randn(256)
    g = torch.Generator()
    plain = grad_of(noise_from, x, g.manual_seed(0))
    ours = grad_of(lambda t, gen: checkpoint(noise_from, t, gen, impl=impl), x, g.manual_seed(0))
    assert torch.equal(plain, ours)


# ---------------------------------------------------- the global generator and threads
def test_another_thread_drawing_during_the_forward_changes_the_recompute():
    """A data-loading thread draws from the global CPU generator while the checkpointed
    forward runs (made deterministic here: it draws between the two dropouts, once)."""
    state = {"forward": True}

    def two_dropouts(x):
        a = F.dropout(x, 0.5)
        if state["forward"]:
            state["forward"] = False
            worker = threading.Thread(target=lambda: torch.rand(1000))
            worker.start()
            worker.join()
        return F.dropout(a, 0.5)

    x = torch.randn(512)

    def run(wrap):
        state["forward"] = True
        torch.manual_seed(0)
        return grad_of(wrap, x)

    plain = run(two_dropouts)
    for name, ckpt in RUNS.items():
        assert not torch.equal(plain, run(lambda t: ckpt(two_dropouts, t))), name
    for impl in ("hooks", "reentrant"):
        with pytest.raises(CheckpointError, match="fingerprint differs"):
            run(lambda t: checkpoint(two_dropouts, t, impl=impl, determinism_check="fingerprint"))
    state["forward"] = False                    # no other draw: every checkpoint is exact
    torch.manual_seed(0)
    quiet = grad_of(two_dropouts, x)
    torch.manual_seed(0)
    assert torch.equal(quiet, grad_of(lambda t: checkpoint(two_dropouts, t), x))


# ------------------------------------------------------------------ batch-norm statistics
def bn_block(bn_class):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), bn_class(4), nn.ReLU())


@pytest.mark.parametrize("name", list(RUNS))
def test_batch_norm_statistics_are_updated_once_by_ckpt_lab_twice_by_torch(name):
    """Gradients are right everywhere. PyTorch's recompute updates the running statistics a
    second time; ckpt_lab's runs on copies of the forward's (module_state) and counts once."""
    x = torch.randn(4, 3, 8, 8)
    plain, ckpt = bn_block(nn.BatchNorm2d), bn_block(nn.BatchNorm2d)
    g_plain = grad_of(plain, x)
    g_ckpt = grad_of(lambda t: RUNS[name](ckpt, t), x)
    assert torch.equal(g_plain, g_ckpt)
    if name.startswith("ckpt_lab"):
        for a, b in zip(plain[1].buffers(), ckpt[1].buffers()):
            assert torch.equal(a, b)
    else:
        assert int(ckpt[1].num_batches_tracked) == 2 * int(plain[1].num_batches_tracked) == 2
        assert not torch.allclose(ckpt[1].running_mean, plain[1].running_mean)
    safe = bn_block(RecomputeSafeBatchNorm2d)      # torch's way around it: skip the update
    assert torch.equal(grad_of(lambda t: RUNS[name](safe, t), x), g_plain)
    assert torch.equal(safe[1].running_mean, plain[1].running_mean)
    assert int(safe[1].num_batches_tracked) == 1
