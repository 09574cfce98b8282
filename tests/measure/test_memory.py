"""track_memory against hand counts, and its behaviour at the edges (nesting, limits, speed)."""
import time

import pytest
import torch
from torch import nn

from ckpt_lab import SimulatedOutOfMemoryError, phase, profile_layers, track_memory

F32 = 4


def mlp(width, depth, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("batch,width,depth", [(8, 16, 1), (32, 64, 4), (7, 33, 6)])
def test_forward_saved_bytes_equal_hand_count(batch, width, depth):
    # Linear saves its input (already counted) and its weight (a parameter: not counted);
    # ReLU saves its output. So after forward each block pins one (batch, width) fp32 tensor,
    # and the last output is the one the caller holds.
    model, x = mlp(width, depth), torch.randn(batch, width)
    with track_memory() as mem:
        y = model(x)
    act = batch * width * F32
    assert mem.current_bytes == depth * act
    # peak: every block's ReLU output plus the Linear output alive while ReLU runs
    assert mem.peak_bytes == depth * act + act
    del y


@pytest.mark.parametrize("batch,width", [(16, 32), (64, 8), (5, 17)])
def test_training_step_peak_equals_hand_count(batch, width):
    # One Linear+ReLU block, input without grad. The moments that can be the peak:
    #   forward: Linear output and ReLU output alive together            2*act
    #   backward, ReLU node: its saved output + incoming grad, plus the
    #     loss scalar and the ones() seed grad (4 bytes each)            2*act + 8
    #   backward, Linear node: ReLU grad + weight grad + bias grad + 8   act + params + 8
    # (the ReLU output is released as soon as its node has run).
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(width, width), nn.ReLU()), torch.randn(batch, width)
    act, params = batch * width * F32, (width * width + width) * F32
    with track_memory() as mem:
        model(x).sum().backward()
    assert mem.peak_bytes == max(2 * act, 2 * act + 8, act + params + 8)
    assert mem.current_bytes == params  # only the .grad tensors outlive the step
    assert mem.phase_peaks()["forward"] == 2 * act


def test_views_are_counted_once_and_preexisting_tensors_not_at_all():
    x = torch.randn(256)
    with track_memory() as mem:
        v = x.view(16, 16).t()      # a view of an outside tensor: nothing new
        y = x * 2                   # new storage: 1 KiB
        s = y[::2].reshape(8, 16)   # still expressible with strides: a view, nothing new
        z = y.view(16, 16).t().contiguous()  # a transpose made contiguous is a copy: 1 KiB
        w = y.view(16, 16)          # a view: nothing new
    assert mem.peak_bytes == 2 * 256 * F32
    assert mem.current_bytes == 2 * 256 * F32
    assert s.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    del v, s, z, w, y


def test_release_is_noticed_immediately():
    with track_memory() as mem:
        a = torch.ones(1000)
        b = torch.ones(1000)
        del a
        c = torch.ones(500)
    assert mem.peak_bytes == 2000 * F32
    assert mem.current_bytes == 1500 * F32
    assert [p.live_bytes for p in mem.timeline] == [4000, 8000, 6000]
    del b, c


def test_nested_and_repeated_use():
    with track_memory() as outer:
        a = torch.ones(100)
        with track_memory() as inner:
            b = torch.ones(300)
            del b
        c = torch.ones(50)
    assert inner.peak_bytes == 300 * F32 and inner.current_bytes == 0
    assert outer.peak_bytes == 400 * F32 and outer.current_bytes == 150 * F32
    for _ in range(3):
        with track_memory() as again:
            d = torch.ones(10)
        assert again.peak_bytes == again.current_bytes == 10 * F32
    del a, c, d


def test_numbers_freeze_when_block_ends():
    with track_memory() as mem:
        a = torch.ones(64)
    del a
    assert mem.current_bytes == 64 * F32


def test_phases_are_labelled():
    model, x = mlp(8, 2), torch.randn(4, 8, requires_grad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with track_memory() as mem:
        model(x).sum().backward()
        with phase("optimizer"):
            opt.step()
    phases = {p.phase for p in mem.timeline}
    assert phases == {"forward", "backward", "optimizer"}
    order = [p.phase for p in mem.timeline]
    assert order.index("backward") > max(i for i, p in enumerate(order) if p == "forward")


def test_limit_raises_an_out_of_memory_error_with_numbers():
    model, x = mlp(64, 4), torch.randn(32, 64)
    with pytest.raises(torch.OutOfMemoryError) as info:
        with track_memory(limit_bytes=20_000):
            model(x).sum().backward()
    err = info.value
    assert isinstance(err, SimulatedOutOfMemoryError)
    assert err.live_bytes > err.limit_bytes == 20_000
    assert "20,000" in str(err)
    with track_memory(limit_bytes=10**9) as mem:
        model(x).sum().backward()
    assert mem.peak_bytes > 20_000


def test_limit_raised_inside_backward_keeps_its_type():
    x = torch.randn(64, 64, requires_grad=True)
    y = (x @ x).relu().sum()
    with pytest.raises(SimulatedOutOfMemoryError):
        with track_memory(limit_bytes=64 * 64 * F32 - 1):
            y.backward()


def test_bad_limit():
    with pytest.raises(ValueError, match="limit_bytes"):
        with track_memory(limit_bytes=-1):
            pass


def test_cuda_peak_is_none_on_cpu():
    with track_memory() as mem:
        torch.ones(3)
    if not torch.cuda.is_available():
        assert mem.cuda_peak_bytes is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_matches_allocator():
    x = torch.randn(1024, 1024, device="cuda")
    x @ x   # the first matmul allocates cuBLAS's workspace (32 MiB on Hopper), not a tensor
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with track_memory() as mem:
        y = x @ x
        z = y.relu()
        del y
    assert mem.peak_bytes == 2 * 1024 * 1024 * F32
    assert mem.peak_bytes <= mem.cuda_peak_bytes < mem.peak_bytes + 16 * 2**20
    del z


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_entering_leaves_the_users_cuda_peak_alone():
    big = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    del big
    user_peak = torch.cuda.max_memory_allocated()
    x = torch.randn(256, 256, device="cuda")
    with track_memory() as mem:
        (x @ x).relu()
    assert torch.cuda.max_memory_allocated() == user_peak   # not reset by the block
    assert mem.cuda_peak_bytes is None          # stayed under the 64 MiB high: unknown
    with track_memory() as mem:
        y = torch.empty(96 * 2**20, dtype=torch.uint8, device="cuda")
    assert torch.cuda.max_memory_allocated() > user_peak
    assert mem.cuda_peak_bytes == 96 * 2**20    # a new high: exact
    del y


class FakeAllocator:
    """Stands in for torch.cuda's statistics: a running total and a maximum only reset on demand."""

    def __init__(self, allocated, peak):
        self.allocated, self.peak, self.resets = allocated, peak, 0

    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def install(self, monkeypatch):
        for name, fn in [("is_available", lambda: True), ("synchronize", lambda *a: None),
                         ("memory_allocated", lambda *a: self.allocated),
                         ("max_memory_allocated", lambda *a: self.peak),
                         ("reset_peak_memory_stats", self.reset)]:
            monkeypatch.setattr(torch.cuda, name, fn)

    def reset(self, *a):
        self.resets += 1
        self.peak = self.allocated


def test_cuda_peak_logic_without_resetting_statistics(monkeypatch):
    # The CUDA bookkeeping on a CPU machine, against a fake allocator.
    fake = FakeAllocator(allocated=100, peak=1000)   # the user's peak from earlier: 1000
    fake.install(monkeypatch)
    with track_memory() as mem:
        fake.alloc(300)
        fake.alloc(-300)
    assert fake.resets == 0 and fake.peak == 1000 and mem.cuda_peak_bytes is None
    with track_memory() as outer:
        fake.alloc(500)
        with track_memory() as inner:
            fake.alloc(700)       # 1300: a new high, exact for both blocks
            fake.alloc(-700)
        fake.alloc(-500)
    assert fake.resets == 0
    assert inner.cuda_peak_bytes == 700 and outer.cuda_peak_bytes == 1200
    fake.reset()                  # the user asks for exact numbers: reset first
    with track_memory() as mem:
        fake.alloc(50)
    assert mem.cuda_peak_bytes == 50 and fake.resets == 1


def test_tensors_built_from_python_data_are_counted():
    # torch.tensor(...) makes its storage below the dispatcher and passes it through
    # lift_fresh, which returns an alias: still a new allocation (AdamW's step counters).
    with track_memory() as mem:
        t = torch.tensor([1.0, 2.0, 3.0])
        s = torch.tensor(0.0)
    assert mem.current_bytes == 3 * F32 + F32
    del t, s


def test_out_and_resize_growth_is_counted():
    a, b = torch.randn(256), torch.randn(256)
    with track_memory() as mem:
        c = torch.empty(0)                    # 0 bytes: nothing yet
        torch.add(a, b, out=c)                # grown by the out= op to 1 KiB
        assert mem.current_bytes == 256 * F32
        c.resize_(1024)                       # grown again to 4 KiB
        assert mem.current_bytes == 1024 * F32
        c.resize_(10)                         # a tensor resize keeps its storage's bytes
        assert mem.current_bytes == 1024 * F32
        del c
        assert mem.current_bytes == 0
    assert mem.peak_bytes == 1024 * F32


def test_growth_past_the_limit_raises():
    c = torch.empty(0)
    with pytest.raises(SimulatedOutOfMemoryError, match="resize_"):
        with track_memory(limit_bytes=1000):
            c.resize_(1000)                  # 4000 bytes


def test_growth_of_a_storage_made_before_the_block_counts_the_growth_only():
    outside = torch.zeros(100)
    with track_memory() as mem:
        outside.resize_(300)                  # 400 -> 1200 bytes: 800 new
        torch.mul(torch.ones(300), 2, out=outside)   # same size: nothing new beyond ones()
    assert mem.peak_bytes == 800 + 300 * F32
    assert mem.current_bytes == 800


def test_storage_resized_to_zero_leaves_the_books():
    # FSDP frees a parameter's memory without freeing its tensor: storage().resize_(0).
    with track_memory() as mem:
        w = torch.randn(1024)
        w.untyped_storage().resize_(0)
        assert mem.current_bytes == 0
        w.untyped_storage().resize_(1024 * F32)   # brought back before its next use
        assert mem.current_bytes == 1024 * F32
        w.untyped_storage().resize_(0)
        x = torch.randn(512)                     # fits where w was: the peak does not move
    assert mem.peak_bytes == 1024 * F32 and mem.current_bytes == 512 * F32
    del x
    # outside the block the storage method is PyTorch's own again
    assert torch.UntypedStorage.resize_ is not None
    from ckpt_lab.measure import memory
    assert torch.UntypedStorage.resize_ is memory._original_storage_resize


def test_tracker_costs_less_than_double_a_training_step(one_thread):
    torch.manual_seed(0)
    model = mlp(512, 4)
    x = torch.randn(256, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    def timed(tracked):
        # CPU time of this process: another job on the shared cores does not inflate it
        start = time.process_time()
        if tracked:
            with track_memory():
                step()
        else:
            step()
        return time.process_time() - start

    for _ in range(3):
        step()
    plain, tracked = [], []
    for _ in range(7):
        plain.append(timed(False))
        tracked.append(timed(True))
    ratio = min(tracked) / min(plain)   # the minimum is the run least disturbed by other load
    assert ratio < 2.0, f"tracker slowed the step {ratio:.2f}x"


def test_profile_layers_attributes_each_storage_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.Dropout(0.1),
                          nn.Linear(32, 8))
    prof = profile_layers(model, torch.randn(16, 64))
    assert [p.name for p in prof] == ["0", "1", "2", "3", "4"]
    assert [p.out_bytes for p in prof] == [16 * 128 * F32, 16 * 128 * F32, 16 * 32 * F32,
                                           16 * 32 * F32, 16 * 8 * F32]
    # Linear saves only its input; ReLU its output; Dropout its float mask; the last Linear
    # is the first to pin Dropout's output.
    assert [p.act_bytes for p in prof] == [0, 16 * 128 * F32, 0, 16 * 32 * F32, 16 * 32 * F32]
    # The sum is exactly what the whole chain pins after forward (minus the output we hold).
    x = torch.randn(16, 64)
    with track_memory() as mem:
        y = model(x)
        out = y.untyped_storage().nbytes()
    assert sum(p.act_bytes for p in prof) == mem.current_bytes - out
    assert all(p.forward_seconds > 0 for p in prof)


def test_profile_layers_bad_input():
    with pytest.raises(ValueError):
        profile_layers([], torch.randn(2))
    with pytest.raises(ValueError):
        profile_layers([nn.ReLU()], torch.randn(2), repeats=0)
