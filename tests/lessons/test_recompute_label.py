"""label_recompute marks PyTorch's own recompute in track_memory timelines, and nothing else."""
import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab import track_memory
from ckpt_lab.lessons.recompute_label import label_recompute
from ckpt_lab.measure.memory import current_phase


def _chain():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("early_stop", [True, False])
def test_torch_recompute_is_labelled_and_the_label_always_closes(early_stop):
    chain, x = _chain(), torch.randn(8, 16, requires_grad=True)
    with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
        with track_memory() as log, label_recompute(chain):
            out = torch.utils.checkpoint.checkpoint(chain, x, use_reentrant=False)
            out.square().sum().backward()
    phases = [p.phase for p in log.timeline]
    first = phases.index("recompute")
    assert "forward" not in phases[first:]            # recompute happens after the forward
    assert phases[-1] == "backward" and phases.count("recompute") >= 3
    assert current_phase() == "forward"               # no label leaks out, early stop or not
    with track_memory() as after:                     # and the hooks are gone
        chain(x).sum().backward()
    assert "recompute" not in {p.phase for p in after.timeline}


def test_a_plain_run_has_no_recompute_and_a_bad_argument_is_refused():
    chain, x = _chain(), torch.randn(8, 16, requires_grad=True)
    with track_memory() as log, label_recompute(chain):
        chain(x).sum().backward()
    assert {p.phase for p in log.timeline} == {"forward", "backward"}
    with pytest.raises(TypeError, match="nn.Module"):
        with label_recompute(lambda t: t):
            pass
