"""The OOM fallback ladder, on a real MLP step under a simulated memory limit."""
import pytest
import torch

from ckpt_lab import track_memory
from ckpt_lab.training.fallback import (NoConfigFitsError, StepConfig, chain_step, config_flops,
                               median_seconds, next_config, policy_for, run_config,
                               run_with_fallback)
from ckpt_lab.training.models import MLPConfig, build_model


def make_step(limit_bytes):
    """A real training step of an 8-block MLP chain, run on a pretend device of limit_bytes."""
    model = build_model(MLPConfig(block_size=16, width=256, depth=8))
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (32, 16), generator=g)
    tgt = torch.randint(0, 256, (32, 16), generator=g)
    return chain_step(model, idx, tgt, limit_bytes), (model, idx, tgt)


def test_ladder_finds_the_first_config_that_fits():
    ladder = [StepConfig(0, 1, 32)]
    while len(ladder) < 6:
        ladder.append(next_config(ladder[-1], max_every=4)[0])
    assert ladder[1:] == [StepConfig(4, 1, 32), StepConfig(2, 1, 32), StepConfig(1, 1, 32),
                          StepConfig(1, 2, 32), StepConfig(1, 4, 32)]
    step, _ = make_step(None)
    peaks = [step(cfg).peak_bytes for cfg in ladder]
    # measured, not assumed: denser is not always leaner (every:1 keeps each block's input,
    # the very tensor an MLP block keeps anyway, and peaks above every:2); accumulation halves
    assert peaks[1] < peaks[0] and peaks[3] > peaks[2]
    assert peaks[5] < min(peaks[:5])
    limit = (peaks[5] + min(peaks[:5])) // 2
    step, _ = make_step(limit)
    out = run_with_fallback(step, StepConfig(0, 1, 32), max_every=4)
    assert [r.config for r in out.rungs] == ladder
    assert [r.fits for r in out.rungs] == [False] * 5 + [True]
    assert out.config == StepConfig(1, 4, 32) and out.result.peak_bytes == peaks[5] <= limit
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


def test_chain_step_measures_what_a_hand_written_step_does():
    step, (model, idx, tgt) = make_step(None)
    cfg = StepConfig(2, 2, 32)
    model.set_policy("every:2")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        for xm, ym in zip(idx[:32].chunk(2), tgt[:32].chunk(2)):
            (model(xm, ym) / 2).backward()
    log = step(cfg)
    assert log.peak_bytes == mem.peak_bytes and log.num_ops == mem.num_ops
    assert policy_for(StepConfig(0)) == "none" and policy_for(cfg) == "every:2"


def test_counted_flops_accumulation_is_free_recompute_is_not():
    _, (model, idx, tgt) = make_step(None)
    plain = config_flops(model, idx, tgt, StepConfig(0, 1, 32))
    assert config_flops(model, idx, tgt, StepConfig(0, 4, 32)) == plain
    assert config_flops(model, idx, tgt, StepConfig(1, 1, 32)) > plain
    assert config_flops(model, idx, tgt, StepConfig(0, 1, 16)) * 2 == plain


def test_median_seconds_times_each_config_without_tracking():
    _, (model, idx, tgt) = make_step(None)
    threads = torch.get_num_threads()
    times = median_seconds(model, idx, tgt, [StepConfig(0, 1, 32), StepConfig(0, 1, 2)], 3)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert torch.get_num_threads() == threads            # restored after timing on one thread
    with pytest.raises(ValueError, match="repeats"):
        median_seconds(model, idx, tgt, [StepConfig()], 0)
    run_config(model, idx, tgt, StepConfig(4, 1, 8))
    assert all(p.grad is not None for p in model.parameters())
