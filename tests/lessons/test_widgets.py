"""The explorers, driven headlessly: move sliders, read results, compare with PyTorch."""
import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab import track_memory
from ckpt_lab.lessons import widgets
from ckpt_lab.measure.memory import kept_after_forward
from ckpt_lab.plan.formulas import chain_step_peak_bytes


def _torch_peak(blocks: nn.Sequential, x, segments: int) -> int:
    """The same step under torch.utils.checkpoint.checkpoint_sequential, measured alike."""
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as log:
        torch.utils.checkpoint.checkpoint_sequential(blocks, segments, x, use_reentrant=False) \
            .sum().backward()
    return log.peak_bytes


def test_segments_explorer_measures_and_redraws():
    e = widgets.segments_explorer(layers=9, segments=3, batch=2, width=32, positions=16)
    assert all(s.continuous_update is False and s.description for s in e.sliders.values())
    first_png = bytes(e.image.value)
    assert first_png.startswith(b"\x89PNG")
    r = e.result
    assert (r.layers, r.segments, r.batch, r.width) == (9, 3, 2, 32)
    assert r.unit_bytes == 2 * 16 * 32 * 4
    assert r.predicted_bytes == chain_step_peak_bytes(9, 3, r.unit_bytes, (32 * 32 + 32) * 4)
    assert all(0.99 <= m / p <= 1.01 for m, p in zip(r.measured_curve, r.predicted_curve))

    e.sliders["segments"].value = 1
    assert e.result.segments == 1 and bytes(e.image.value) != first_png
    # PyTorch's own checkpoint_sequential as the oracle for every point of the curve
    blocks = e._blocks(9, 32)
    torch.manual_seed(1)
    x = torch.randn(2 * 16, 32, device=e.device, requires_grad=True)
    for s in (1, 3, 9):
        assert e.result.measured_curve[s - 1] == _torch_peak(blocks, x, s)
    assert e.result.best_segments == e.result.predicted_best == 3

    e.sliders["layers"].value = 4          # segments slider follows the layer count
    assert e.sliders["segments"].max == 4 and len(e.result.measured_curve) == 4
    e.sliders["segments"].value = 4
    e.sliders["layers"].value = 2
    assert e.result.segments == 2 == e.sliders["segments"].value


def test_seq_explorer_matches_formula_and_grows_quadratically():
    e = widgets.seq_explorer(seq=16, batch=2, n_embd=32, n_head=2, max_seq=64, step=16)
    png = bytes(e.image.value)
    shares = []
    for seq in (16, 32, 64):
        e.sliders["seq_len"].value = seq
        r = e.result
        assert r.seq == seq
        assert abs(r.ratio - 1) < 1e-3, r
        # kept bytes are those of the block measured directly
        torch.manual_seed(1)
        assert r.measured_bytes == kept_after_forward(e.block, torch.randn(2, seq, 32, device=e.device,
                                                                           requires_grad=True))
        shares.append(r.quadratic_bytes / (r.linear_bytes + r.quadratic_bytes))
    assert shares[0] < shares[1] < shares[2]
    assert bytes(e.image.value) != png
    assert e.sliders["seq_len"].description == "seq_len" and not e.sliders["seq_len"].continuous_update


def test_seq_explorer_measures_the_lengths_asked_up_front():
    """The first figure (what a static page keeps) already holds points across T."""
    import pytest
    e = widgets.seq_explorer(seq=16, batch=2, n_embd=32, n_head=2, max_seq=64, step=16,
                             measure_at=(32, 64))
    assert sorted(e.measured) == [16, 32, 64]
    torch.manual_seed(1)
    assert e.measured[64] == kept_after_forward(e.block, torch.randn(2, 64, 32, device=e.device,
                                                                     requires_grad=True))
    with pytest.raises(ValueError, match="between"):
        widgets.seq_explorer(seq=16, batch=2, n_embd=32, n_head=2, max_seq=64, measure_at=(65,))


def test_bad_slider_start_is_a_clear_error():
    import pytest
    with pytest.raises(ValueError, match="between"):
        widgets.segments_explorer(layers=4, segments=6)
