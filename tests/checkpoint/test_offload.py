"""Activation offload: exact gradients, byte counts checked by hand and by an independent hook,
and the GPU's copy path run on CPU (storages copied to separate buffers and back)."""
import contextlib
import weakref

import pytest
import torch
from torch import nn

from ckpt_lab import OffloadStats, checkpoint_sequential, offload_activations, track_memory
from ckpt_lab.checkpoint import offload
from ckpt_lab.lessons.course import dropout_mask_bytes
from ckpt_lab.checkpoint.offload import PCIE4_X16_BYTES_PER_S
from oracle import same

BATCH, WIDTH, HIDDEN = 8, 16, 64
F32 = 4


def mlp(seed=0, p=0.0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.ReLU(), nn.Dropout(p),
                         nn.Linear(HIDDEN, WIDTH), nn.Tanh())


def inputs(device="cpu"):
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1)).to(device) \
        .requires_grad_()


def grads(model, x, wrap, run=None, seed=3):
    """Gradients (input first) of a fixed loss, forward inside `wrap()`, backward after it."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    with wrap():
        loss = (run or model)(x).pow(2).sum()
    loss.backward()
    return [x.grad] + [p.grad for p in model.parameters()]


class HostCopies(offload._Mover):
    """The copy path on CPU: each storage really goes to a separate buffer and comes back as a
    fresh storage (what CUDA does, minus streams and pinned memory). Remembers every restore."""

    def __init__(self, events):
        super().__init__(events)
        self.restored = []

    def moves(self, t):
        return True

    def to_host(self, st, device):
        return torch.empty(0, dtype=torch.uint8).set_(st).clone(), None

    def to_device(self, parked):
        st = parked.host.clone().untyped_storage()
        self.restored.append(weakref.ref(st))
        return st


@contextlib.contextmanager
def host_copies():
    """Inside this block offload_activations copies CPU storages; yields the movers it makes."""
    made, original = [], offload._Mover
    offload._Mover = lambda events: made.append(HostCopies(events)) or made[-1]
    try:
        yield made
    finally:
        offload._Mover = original


def recording(into: dict, name: str):
    """A wrap for `grads` that offloads and files the stats under `name`."""
    @contextlib.contextmanager
    def wrap():
        with offload_activations() as stats:
            into[name] = stats
            yield
    return wrap


def test_counts_by_hand_on_a_two_layer_mlp():
    # Saved for backward: x and W1.t() (a leaf that requires grad and a view of one: kept),
    # ReLU's output (saved by the ReLU and by the second Linear: one storage, moved once),
    # W2.t() (kept), tanh's output (saved by the tanh and by the loss's pow: moved once).
    m, x = mlp(), inputs()
    with offload_activations() as stats:
        loss = m(x).pow(2).sum()
    relu_out, tanh_out = BATCH * HIDDEN * F32, BATCH * WIDTH * F32
    assert (stats.tensors, stats.storages, stats.kept) == (4, 2, 3)
    assert stats.bytes_offloaded == relu_out + tanh_out
    assert stats.bytes_restored == 0
    loss.backward()  # after the block: the saved tensors still come back through it
    # Each moved storage comes back once per node that reads it: twice.
    assert stats.bytes_restored == 2 * (relu_out + tanh_out)
    assert stats.transfer_seconds == 3 * (relu_out + tanh_out) / PCIE4_X16_BYTES_PER_S
    assert stats.copied_bytes == 0 and stats.copy_seconds() is None  # CPU: accounting mode


def test_min_bytes_leaves_small_storages_in_place():
    m, x = mlp(), inputs()
    with offload_activations(min_bytes=BATCH * HIDDEN * F32, bandwidth_bytes_per_s=1e9) as s:
        m(x).sum().backward()
    assert (s.tensors, s.storages, s.kept, s.bytes_offloaded) == (2, 1, 4, BATCH * HIDDEN * F32)
    assert s.transfer_seconds == 3 * BATCH * HIDDEN * F32 / 1e9


def test_dropout_masks_and_layernorm_statistics_move():
    torch.manual_seed(0)
    lin, ln, drop = nn.Linear(WIDTH, HIDDEN), nn.LayerNorm(HIDDEN), nn.Dropout(0.5)
    x = torch.randn(BATCH, WIDTH)
    with offload_activations() as stats:
        drop(ln(lin(x))).sum()
    # Moved: the LayerNorm's input, its mean and 1/std (one number per row each) and the
    # dropout mask. Kept: x (made before the block) and the LayerNorm's weight and bias.
    expected = BATCH * HIDDEN * F32 + 2 * BATCH * F32 + BATCH * HIDDEN * dropout_mask_bytes()
    assert (stats.storages, stats.kept, stats.bytes_offloaded) == (4, 3, expected)


def test_parameters_their_views_and_grad_leaves_stay():
    w = nn.Parameter(torch.randn(WIDTH, HIDDEN))
    with offload_activations() as stats:
        h = torch.randn(BATCH, WIDTH)                          # made inside, no grad: moves
        leaf = torch.randn(BATCH, HIDDEN, requires_grad=True)  # made inside, but a grad leaf
        loss = (((h @ w) * leaf) @ w.t()).sum() + (h @ w).sum()
    # The first mm saves h (moved); mul saves leaf (kept) and h @ w (moved); the next mm
    # saves the product (moved) and the view w.t() (kept); the last mm h again (no new bytes).
    assert (stats.tensors, stats.storages, stats.kept) == (4, 3, 2)
    assert stats.bytes_offloaded == BATCH * WIDTH * F32 + 2 * BATCH * HIDDEN * F32
    loss.backward()
    assert stats.bytes_restored == 2 * BATCH * WIDTH * F32 + 2 * BATCH * HIDDEN * F32


def test_tensors_made_before_the_block_stay_the_same_made_inside_move():
    torch.manual_seed(0)
    emb, lin = nn.Embedding(32, WIDTH), nn.Linear(WIDTH, WIDTH)
    idx, x = torch.randint(0, 32, (BATCH,)), torch.randn(BATCH, WIDTH)
    with offload_activations() as before:
        emb(idx).sum()
        lin(x).sum()
    assert (before.tensors, before.kept) == (0, 2)       # the token ids and x: kept
    with offload_activations() as inside:
        emb(idx.clone()).sum()
        lin(x.clone()).sum()
    assert (inside.tensors, inside.kept) == (2, 0)
    assert inside.bytes_offloaded == BATCH * 8 + BATCH * WIDTH * F32   # int64 ids, fp32 x


def views_step(wrap):
    """One storage (y) saved under four views and read by three nodes; gradients."""
    a = torch.randn(BATCH, HIDDEN, generator=torch.Generator().manual_seed(2), requires_grad=True)
    z = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(3), requires_grad=True)
    with wrap():
        y = (a * 2).exp()                                 # exp saves y
        q, k = y.chunk(2, dim=1)
        loss = (y.t() @ z).sum() + (q * k).sum()          # mm saves y.t() and z; mul q and k
    loss.backward()
    return [a.grad, z.grad]


def test_one_storage_under_four_views_moves_once_and_returns_once_per_node():
    y_bytes = BATCH * HIDDEN * F32
    plain = views_step(contextlib.nullcontext)
    stats = {}
    assert same(plain, views_step(recording(stats, "accounting")))
    with host_copies() as movers:
        assert same(plain, views_step(recording(stats, "copies")))   # views rebuilt exactly
    for s in stats.values():
        assert (s.tensors, s.storages, s.kept) == (4, 1, 1)
        assert s.bytes_offloaded == y_bytes
        assert s.bytes_restored == 3 * y_bytes   # by exp, mm and mul; q and k share a copy
    assert stats["copies"].copied_bytes == y_bytes and stats["accounting"].copied_bytes == 0
    restored = movers[0].restored
    assert len(restored) == 3 and all(r() is None for r in restored)   # none outlives its node


def test_bytes_equal_distinct_storages_made_inside_seen_by_an_independent_hook():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    x = torch.randn(2, 10, 32)
    before = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    before.add(x.untyped_storage().data_ptr())
    saved, moved = [], {}

    def record(t):
        saved.append(t)
        st = t.untyped_storage()
        if st.data_ptr() not in before:
            moved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        layer(x)
    for min_bytes in (0, 1024):
        with offload_activations(min_bytes=min_bytes) as stats:
            layer(x)
        expected = [n for n in moved.values() if n >= min_bytes]
        assert stats.storages == len(expected) > 0
        assert stats.bytes_offloaded == sum(expected)
        assert stats.tensors + stats.kept == len(saved)


def test_accounting_mode_counts_what_the_copy_path_moves():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    x = torch.randn(2, 10, 32)
    stats = {}
    plain = grads(layer, x, torch.enable_grad)
    counted = grads(layer, x, recording(stats, "accounting"))
    with host_copies():
        copied = grads(layer, x, recording(stats, "copies"))
    assert same(plain, counted) and same(plain, copied)
    a, c = stats["accounting"], stats["copies"]
    assert (a.tensors, a.storages, a.kept, a.bytes_offloaded, a.bytes_restored) == \
        (c.tensors, c.storages, c.kept, c.bytes_offloaded, c.bytes_restored)
    assert a.copied_bytes == 0 and c.copied_bytes == c.bytes_offloaded > 0


def test_gradients_bitwise_equal_with_dropout_and_checkpoints():
    m, x = mlp(p=0.3), inputs()
    assert same(grads(m, x, torch.enable_grad), grads(m, x, offload_activations))
    chain = nn.Sequential(*[mlp(seed=i, p=0.3) for i in range(4)])
    ref = grads(chain, x, torch.enable_grad)
    # Offload around checkpoints: only the kept segment inputs are saved, and they move.
    run = lambda x: checkpoint_sequential(chain, x, segments=4)  # noqa: E731
    assert same(ref, grads(chain, x, offload_activations, run=run))
    with host_copies():
        assert same(ref, grads(chain, x, offload_activations, run=run))
        assert same(ref, grads(chain, x, offload_activations))


def test_cpu_accounting_mode_changes_no_memory():
    m, x = mlp(), inputs()
    peaks = []
    for wrap in (torch.enable_grad, offload_activations):
        m.zero_grad(set_to_none=True)
        with track_memory() as mem, wrap():
            m(x).pow(2).sum().backward()
        peaks.append(mem.peak_bytes)
    assert peaks[0] == peaks[1]


def test_retain_graph_restores_twice():
    m, x = mlp(), inputs()
    with offload_activations() as s:
        loss = m(x).sum()
    loss.backward(retain_graph=True)
    once = s.bytes_restored
    loss.backward()
    assert s.bytes_restored == 2 * once > 0


def test_bad_arguments_get_clear_errors():
    for bad in (-1, 1.5, True, "1k"):
        with pytest.raises(ValueError, match="min_bytes"):
            with offload_activations(min_bytes=bad):
                pass
    for bad in (0, -5.0, float("inf"), float("nan"), "fast", None):
        with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
            with offload_activations(bandwidth_bytes_per_s=bad):
                pass
    assert isinstance(OffloadStats(0, 1.0).transfer_seconds, float)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_offload_frees_device_memory_and_is_exact():
    torch.manual_seed(0)
    chain = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU())
                            for _ in range(8)]).cuda()
    x = torch.randn(4096, 1024, device="cuda")
    peaks, results = {}, {}
    for name, wrap in (("plain", torch.enable_grad), ("offload", offload_activations)):
        with track_memory() as mem:
            results[name] = [g.clone() for g in grads(chain, x, wrap)]  # .grad is reused below
        peaks[name] = mem.peak_bytes_by_device["cuda:0"]
    with offload_activations() as stats:
        loss = chain(x).pow(2).sum()
    loss.backward()
    assert same(results["plain"], results["offload"])
    assert stats.copied_bytes == stats.bytes_offloaded > 0
    assert stats.bytes_restored >= stats.bytes_offloaded
    # Plain keeps 2 activations per layer (Linear's input, GELU's input) on the device;
    # offloaded, only the ones in flight stay.
    assert peaks["offload"] < peaks["plain"] - stats.bytes_offloaded // 2
    assert stats.copy_seconds() > 0     # the bandwidth: benchmarks/gpu_check.py's copy_bytes_per_s
