"""chunked_cross_entropy against F.cross_entropy (value and gradients), its errors, and its peak
against the formula, both as track_memory counts it and as the CPU allocator sees it."""
import pytest
import torch
import torch.nn.functional as F

import ckpt_lab
from ckpt_lab import formulas, track_memory
from ckpt_lab.measure.allocator import profiled_memory
from ckpt_lab.training.losses import chunked_cross_entropy

# Tolerances for chunks > 1: the chunks' summed losses are added in another order than
# nll_loss's own sum, and the weight's gradient is a sum of per-chunk matmuls. Measured here:
# the loss within 1.1e-7 relative, gradient entries within 2.3e-8 absolute (3e-7 of the largest
# entry). hidden's gradient is computed row by row and came out bitwise equal for 2, 3 and 7
# chunks but not for 1-row chunks (another BLAS path), so bitwise is asserted for one chunk only.
RTOL, ATOL = 1e-5, 1e-7


def _inputs(shape=(64,), d=32, V=1000, seed=0, ignore=()):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, d, generator=g).requires_grad_()
    weight = (0.3 * torch.randn(V, d, generator=g)).requires_grad_()
    targets = torch.randint(V, shape, generator=g)
    flat = targets.view(-1)
    for i in ignore:
        flat[i] = -100
    return hidden, weight, targets


def _loss_and_grads(fn, hidden, weight, targets):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets)
    loss.backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


def _reference(hidden, weight, targets, ignore_index=-100):
    rows = hidden.reshape(-1, hidden.size(-1))
    return F.cross_entropy(rows @ weight.T, targets.reshape(-1), ignore_index=ignore_index)


def test_exported_at_the_top_level():
    assert ckpt_lab.chunked_cross_entropy is chunked_cross_entropy


def test_one_chunk_is_bitwise_the_plain_loss():
    """One chunk runs the same kernels on the same rows: value and gradients are bitwise equal."""
    h, w, t = _inputs(ignore=(3, 9))
    ref = _loss_and_grads(_reference, h, w, t)
    got = _loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunks=1), h, w, t)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(64,), (4, 16)])
@pytest.mark.parametrize("chunks", [2, 3, 7, 64])
def test_value_and_gradients_match_the_plain_loss(shape, chunks):
    h, w, t = _inputs(shape, ignore=(0, 5, 33))
    ref = _loss_and_grads(_reference, h, w, t)
    got = _loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunks=chunks), h, w, t)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)
    assert got[1].shape == h.shape


def test_ignore_index_means_over_the_rows_that_count():
    h, w, t = _inputs((20,), V=50)
    t[::3] = 7
    for ignore_index in (7, -100):
        ref = F.cross_entropy(h @ w.T, t, ignore_index=ignore_index)
        got = chunked_cross_entropy(h, w, t, 4, ignore_index=ignore_index)
        torch.testing.assert_close(got, ref, rtol=RTOL, atol=ATOL)
    kept = t != 7
    manual = F.cross_entropy(h[kept] @ w.T, t[kept])
    torch.testing.assert_close(chunked_cross_entropy(h, w, t, 4, ignore_index=7), manual,
                               rtol=RTOL, atol=ATOL)


def test_every_row_ignored_gives_nan_like_pytorch():
    h, w, t = _inputs((8,), V=10)
    t.fill_(-100)
    assert torch.isnan(F.cross_entropy(h @ w.T, t))
    assert torch.isnan(chunked_cross_entropy(h, w, t, 2))


def test_bf16_autocast_follows_the_plain_loss():
    h, w, t = _inputs((32,), V=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(h @ w.T, t)
        got = chunked_cross_entropy(h, w, t, 4)
    assert got.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)


REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_reduction_and_label_smoothing_match_the_plain_loss(reduction, label_smoothing):
    h, w, t = _inputs((4, 16), ignore=(0, 5, 33))
    kw = {"reduction": reduction, "label_smoothing": label_smoothing}
    ref = _loss_and_grads(lambda h, w, t: F.cross_entropy(
        h.reshape(-1, h.size(-1)) @ w.T, t.reshape(-1), **kw).reshape(
        t.shape if reduction == "none" else ()).sum(), h, w, t)
    got = _loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunks=5, **kw).sum(), h, w, t)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)
    rows = chunked_cross_entropy(h, w, t, 5, **kw)
    assert rows.shape == (t.shape if reduction == "none" else ())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_low_precision_is_summed_in_fp32(dtype, reduction, label_smoothing):
    """bf16/fp16 rows: each chunk's losses and the chunks' sum add up in fp32, so the loss is
    as close to an fp32 cross-entropy of the same logits as the plain loss is, or within one
    unit of the dtype's last place (summed in bf16, 64 chunks of 64 rows were 0.09 nats off)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4096, 64, generator=g).to(dtype)
    w = (0.3 * torch.randn(1000, 64, generator=g)).to(dtype)
    t = torch.randint(1000, (4096,), generator=g)
    t[::7] = -100
    kw = {"reduction": reduction, "label_smoothing": label_smoothing}
    exact = F.cross_entropy(h.float() @ w.float().T, t, **kw)
    plain = F.cross_entropy(h @ w.T, t, **kw)
    got = chunked_cross_entropy(h, w, t, 64, **kw)
    assert got.dtype == plain.dtype == dtype
    ulp = torch.finfo(dtype).eps * exact.abs().clamp(min=1.0)
    assert ((got.float() - exact).abs() <= torch.maximum((plain.float() - exact).abs(), ulp)).all()


@pytest.mark.parametrize("kw,match", [({"reduction": "avg"}, "reduction must be one of"),
                                      ({"label_smoothing": 1.5}, "label_smoothing must be")])
def test_bad_reduction_and_label_smoothing_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        chunked_cross_entropy(*_inputs(), 2, **kw)


@pytest.mark.parametrize("chunks", [0, 65, 2.0, True, None])
def test_bad_chunks_say_what_is_allowed(chunks):
    h, w, t = _inputs()
    with pytest.raises(ValueError, match=r"chunks must be an int from 1 to the number of rows \(64\)"):
        chunked_cross_entropy(h, w, t, chunks)


@pytest.mark.parametrize("case, message", [
    ("transposed weight", r"weight must be \(V, d\)"),
    ("targets too short", "targets must have hidden's leading shape"),
    ("float targets", "class indices"),
    ("1-D hidden", r"hidden must be \(N, d\)"),
])
def test_shape_mismatches_are_refused(case, message):
    h, w, t = _inputs()
    if case == "transposed weight":
        w = w.detach().T
    elif case == "targets too short":
        t = t[:-1]
    elif case == "float targets":
        t = t.float()
    else:
        h = h[0]
    with pytest.raises(ValueError, match=message):
        chunked_cross_entropy(h, w, t, 2)


def test_the_full_logits_never_exist():
    """No storage as large as the N x V logits is ever allocated with 4 chunks."""
    h, w, t = _inputs((64,), d=16, V=4096)
    sizes = []

    class Biggest(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                sizes.append(out.untyped_storage().nbytes())
            return out

    with Biggest():
        chunked_cross_entropy(h, w, t, 4).backward()
    assert max(sizes) == 16 * 4096 * 4          # one chunk's logits, never 64 rows of them


# ------------------------------------------------------------------------- the peak formula
PEAK_CASES = [(rows, d, V, chunks) for rows, d, V in [(64, 32, 1000), (256, 64, 4096),
                                                     (100, 48, 3000)]
              for chunks in (1, 2, 3, 7, 16)]
SCALARS = 12   # the formula leaves out the loss, its gradient, a chunk's summed loss (4 bytes each)


def _step(rows, d, V, chunks):
    h, w, t = _inputs((rows,), d=d, V=V)

    def step():
        chunked_cross_entropy(h, w, t, chunks).backward()
        h.grad = w.grad = None
    step()                                     # warm-up: lazy initialisation
    return step


@pytest.mark.parametrize("rows, d, V, chunks", PEAK_CASES)
def test_tracked_peak_is_the_formula(rows, d, V, chunks):
    step = _step(rows, d, V, chunks)
    with track_memory() as mem:
        step()
    predicted = formulas.chunked_cross_entropy_peak_bytes(rows, V, d, chunks, tracked=True)
    assert 0 <= mem.peak_bytes - predicted <= SCALARS, (mem.peak_bytes, predicted)


@pytest.mark.parametrize("rows, d, V, chunks", [c for c in PEAK_CASES if c[3] in (1, 3, 16)])
def test_allocator_peak_is_the_formula(rows, d, V, chunks, one_thread):
    """Untracked, autograd adds later chunks' weight gradients in place: the allocator's own
    events (torch.profiler) agree with the formula's default (tracked=False)."""
    step = _step(rows, d, V, chunks)
    seen = profiled_memory(step).peak_bytes
    predicted = formulas.chunked_cross_entropy_peak_bytes(rows, V, d, chunks)
    assert 0 <= seen - predicted <= SCALARS, (seen, predicted)


def test_plain_loss_peak_is_its_formula():
    h, w, t = _inputs((256,), d=64, V=4096)
    with track_memory() as mem:
        F.cross_entropy(h @ w.T, t).backward()
    predicted = formulas.cross_entropy_peak_bytes(256, 4096, 64)
    assert predicted == 3 * 256 * 4096 * 4
    assert 0 <= mem.peak_bytes - predicted <= SCALARS


def test_more_chunks_lower_the_peak_until_the_gradients_dominate():
    rows, V, d = 4096, 32768, 64
    peaks = [formulas.chunked_cross_entropy_peak_bytes(rows, V, d, k) for k in (1, 4, 16, 64)]
    assert peaks == sorted(peaks, reverse=True)
    assert peaks[0] == formulas.cross_entropy_peak_bytes(rows, V, d)
    moments = formulas.chunked_cross_entropy_moments(rows, V, d, 4096)
    floor = 3 * V * d * 4 + 2 * d * 4         # first out-of-place sum of two 1-row gradients
    assert max(moments.values()) == floor
    assert formulas.chunk_rows(10, 4) == [3, 3, 2, 2]
