"""Activation offload: exact gradients, byte counts checked by hand and by an independent hook."""
import pytest
import torch
from torch import nn

from ckpt_lab import OffloadStats, checkpoint_sequential, offload_activations, track_memory
from ckpt_lab.offload import PCIE4_X16_BYTES_PER_S

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


def same(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


def test_counts_by_hand_on_a_two_layer_mlp():
    # Saved for backward: x and W1.t() (the caller's and the module's: kept), ReLU's output
    # (saved by the ReLU and by the second Linear: moved once), W2.t() (kept), tanh's output
    # (saved by the tanh and by the loss's pow: moved once).
    m, x = mlp(), inputs()
    with offload_activations() as stats:
        loss = m(x).pow(2).sum()
    relu_out, tanh_out = BATCH * HIDDEN * F32, BATCH * WIDTH * F32
    assert (stats.tensors, stats.kept) == (2, 3)
    assert stats.bytes_offloaded == relu_out + tanh_out
    assert stats.bytes_restored == 0
    loss.backward()  # after the block: the saved tensors still come back through it
    # Each moved tensor comes back once per reader: twice.
    assert stats.bytes_restored == 2 * (relu_out + tanh_out)
    assert stats.transfer_seconds == 3 * (relu_out + tanh_out) / PCIE4_X16_BYTES_PER_S
    assert stats.copied_bytes == 0 and stats.copy_seconds() is None  # CPU: accounting mode


def test_min_bytes_leaves_small_tensors_in_place():
    m, x = mlp(), inputs()
    with offload_activations(min_bytes=BATCH * HIDDEN * F32, bandwidth_bytes_per_s=1e9) as s:
        m(x).sum().backward()
    assert (s.tensors, s.kept, s.bytes_offloaded) == (1, 4, BATCH * HIDDEN * F32)
    assert s.transfer_seconds == 3 * BATCH * HIDDEN * F32 / 1e9


def test_bytes_equal_distinct_saved_activations_seen_by_an_independent_hook():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 10, 32, requires_grad=True)
    seen = {}

    def record(t):
        if t.grad_fn is not None and (t._base is None or not t._base.is_leaf):
            seen[id(t)] = (t, t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        layer(x)
    for min_bytes in (0, 1024):
        with offload_activations(min_bytes=min_bytes) as stats:
            layer(x)
        expected = [n for _, n in seen.values() if n >= min_bytes]
        assert stats.tensors == len(expected) > 0
        assert stats.bytes_offloaded == sum(expected)


def test_gradients_bitwise_equal_with_dropout_and_checkpoints():
    m, x = mlp(p=0.3), inputs()
    assert same(grads(m, x, torch.enable_grad), grads(m, x, offload_activations))
    chain = nn.Sequential(*[mlp(seed=i, p=0.3) for i in range(4)])
    ref = grads(chain, x, torch.enable_grad)
    # Offload around checkpoints: only the kept segment inputs are saved, and they move.
    ours = grads(chain, x, offload_activations,
                 run=lambda x: checkpoint_sequential(chain, x, segments=4))
    assert same(ref, ours)


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
            results[name] = grads(chain, x, wrap)
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
    seconds = stats.copy_seconds()
    assert seconds > 0
    assert 1e9 < (stats.bytes_offloaded + stats.bytes_restored) / seconds < 1e12
