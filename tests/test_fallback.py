"""The OOM fallback ladder, on a real MLP step under a simulated memory limit."""
import pytest
import torch

from ckpt_lab import track_memory
from ckpt_lab.fallback import (NoConfigFitsError, StepConfig, next_config,
                               run_with_fallback)
from ckpt_lab.models import MLPConfig, build_model


def make_step(limit_bytes):
    """A real training step of an 8-block MLP chain, run on a pretend device of limit_bytes."""
    model = build_model(MLPConfig(block_size=16, width=256, depth=8))
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (32, 16), generator=g)
    tgt = torch.randint(0, 256, (32, 16), generator=g)
    peaks = []

    def step(cfg: StepConfig):
        model.set_policy(f"every:{cfg.checkpoint_every}" if cfg.checkpoint_every else "none")
        model.zero_grad(set_to_none=True)
        with track_memory(limit_bytes=limit_bytes) as mem:
            for i in range(cfg.accumulation_steps):
                sl = slice(i * cfg.micro_batch, (i + 1) * cfg.micro_batch)
                (model(idx[sl], tgt[sl]) / cfg.accumulation_steps).backward()
        peaks.append(mem.peak_bytes)
        return mem.peak_bytes

    return step, peaks


def test_ladder_finds_the_first_config_that_fits():
    ladder = [StepConfig(0, 1, 32)]
    while len(ladder) < 6:
        ladder.append(next_config(ladder[-1], max_every=4)[0])
    assert ladder[1:] == [StepConfig(4, 1, 32), StepConfig(2, 1, 32), StepConfig(1, 1, 32),
                          StepConfig(1, 2, 32), StepConfig(1, 4, 32)]
    step, _ = make_step(None)
    peaks = [step(cfg) for cfg in ladder]
    # measured, not assumed: every:1 saves nothing here (an MLP block saves only the tensor
    # the next block's input is anyway), and 2 accumulation steps are not enough
    assert peaks[3] == peaks[0] and peaks[4] > peaks[2]
    assert peaks[5] < min(peaks[:5])
    limit = (peaks[5] + min(peaks[:5])) // 2
    step, _ = make_step(limit)
    out = run_with_fallback(step, StepConfig(0, 1, 32), max_every=4)
    assert [r.config for r in out.rungs] == ladder
    assert [r.fits for r in out.rungs] == [False] * 5 + [True]
    assert out.config == StepConfig(1, 4, 32) and out.result == peaks[5] <= limit
    assert "simulated out of memory" in out.rungs[0].error


def test_ladder_order_is_configurable_and_shrink_comes_last():
    cfg = StepConfig(0, 1, 4)
    assert next_config(cfg, ("accumulate", "densify"))[0] == StepConfig(0, 2, 4)
    assert next_config(StepConfig(1, 4, 4))[0] == StepConfig(1, 2, 2)  # shrink keeps micro 1
    assert next_config(StepConfig(1, 1, 1)) == (None, None)
    with pytest.raises(ValueError, match="unknown move"):
        next_config(cfg, ("explode",))


def test_nothing_fits_raises_with_the_log():
    step, _ = make_step(1)
    with pytest.raises(NoConfigFitsError) as err:
        run_with_fallback(step, StepConfig(0, 1, 4), max_every=2)
    assert all(not r.fits for r in err.value.rungs) and len(err.value.rungs) > 4


def test_other_errors_are_not_swallowed():
    def step(cfg):
        raise RuntimeError("not memory")
    with pytest.raises(RuntimeError, match="not memory"):
        run_with_fallback(step, StepConfig())


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(accumulation_steps=3),
                                    dict(checkpoint_every=-1)])
def test_bad_configs(kwargs):
    with pytest.raises(ValueError):
        StepConfig(**kwargs)


def test_bad_ladder_arguments():
    with pytest.raises(ValueError, match="order"):
        run_with_fallback(lambda c: 0, StepConfig(), order=())
    with pytest.raises(ValueError, match="max_every"):
        run_with_fallback(lambda c: 0, StepConfig(), max_every=0)
