"""Training: checkpointing changes nothing but memory; accumulation, resume and AMP behave."""
import pytest
import torch

from ckpt_lab.training.data import ImageBatches, TextBatches, load_corpus, split_corpus
from ckpt_lab.training.models import CheckpointScheme, build_model, get_config
from ckpt_lab.training.loop import StepRecord, load_run_state, make_optimizer, save_run_state, train


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


TOKENS = split_corpus(load_corpus())[0]
GPT = get_config("gpt-tiny")                       # dropout 0.1


def gpt_batches(batch_size=4, seed=0, cfg=GPT):
    return TextBatches(TOKENS, batch_size, cfg.block_size, seed)


def run(policy=None, impl=None, steps=20, cfg=GPT, **kw):
    model = build_model(cfg)
    result = train(model, gpt_batches(cfg=cfg), steps, policy=policy, impl=impl, seed=0,
                   progress=False, measure_memory=False, lr=3e-3, **kw)
    return result, model


@pytest.fixture(scope="module")
def plain_run():
    return run()


class Plan:
    """What a planner hands back: segment starts over model.layers()."""

    boundaries = [0, 2]


@pytest.mark.parametrize("policy, impl", [
    ("every", "hooks"), ("every", "reentrant"), ("every:2", "hooks"),
    ("selective", "hooks"), ("selective", "reentrant"), ([0, 1, 3], "hooks"),
    ([0, 2], "reentrant"), (Plan(), "hooks"), ("every", "torch"),
])
def test_twenty_steps_bitwise_equal_with_and_without_checkpointing(plain_run, policy, impl):
    (ref, ref_model), (res, model) = plain_run, run(policy, impl)
    assert res.losses == ref.losses
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref_model.parameters()))


def test_gradient_accumulation_matches_one_big_batch():
    cfg = get_config("gpt-tiny", dropout=0.0)
    one, m1 = run(cfg=cfg, steps=5)
    four, m4 = run(cfg=cfg, steps=5, micro_batches=4, policy="every")
    for a, b in zip(one.losses, four.losses):
        assert a == pytest.approx(b, rel=1e-5)
    for p, q in zip(m1.parameters(), m4.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="equal micro-batches"):
        run(cfg=cfg, steps=1, micro_batches=3)


def test_loss_falls_on_the_real_corpus():
    result, _ = run(steps=60)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert first > 5.0                    # ~ln(256) = 5.55 at initialisation
    assert last < first - 1.5


def test_resume_equals_an_uninterrupted_run(tmp_path):
    full, full_model = run(steps=12)
    model = build_model(GPT)
    first = train(model, gpt_batches(), 7, seed=0, progress=False, measure_memory=False, lr=3e-3)
    path = save_run_state(tmp_path / "run.pt", model, first.optimizer, first.next_step)
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]      # no temp file left
    torch.manual_seed(123)                                           # disturb the RNG
    resumed = build_model(GPT, seed=99)
    opt = make_optimizer(resumed, lr=3e-3)
    step = load_run_state(path, resumed, opt)
    assert step == 7
    second = train(resumed, gpt_batches(), 5, optimizer=opt, start_step=step, progress=False,
                   measure_memory=False)
    assert first.losses + second.losses == full.losses
    assert [r.step for r in second.records] == [7, 8, 9, 10, 11]
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(), full_model.parameters()))


def test_records_measure_memory_and_checkpointing_lowers_it():
    cfg = get_config("gpt-tiny", block_size=32, n_layer=4)
    common = dict(seed=0, progress=False)
    plain = train(build_model(cfg), gpt_batches(cfg=cfg), 2, **common).records
    every = train(build_model(cfg), gpt_batches(cfg=cfg), 2, policy="every", **common).records
    rec = plain[-1]
    assert isinstance(rec, StepRecord) and rec.step == 1
    assert rec.seconds > 0 and rec.tokens_per_s == pytest.approx(4 * 32 / rec.seconds)
    # a CPU model allocates nothing on a GPU: no CUDA peak without CUDA, zero with it
    assert (rec.cuda_peak_bytes in (0, None)) if torch.cuda.is_available() else \
        rec.cuda_peak_bytes is None
    assert set(rec.phase_peaks) >= {"forward", "backward", "optimizer"}
    assert "recompute" in every[-1].phase_peaks and "recompute" not in rec.phase_peaks
    assert every[-1].peak_bytes < rec.peak_bytes
    assert plain[0].phase_peaks["optimizer"] > plain[1].phase_peaks["optimizer"]  # Adam state


def test_bf16_autocast_on_cpu_trains_and_checkpointing_replays_it():
    plain, plain_model = run(steps=3, precision="bf16")
    every, model = run(steps=3, precision="bf16", policy="every")
    selective, _ = run(steps=3, precision="bf16", policy="selective", impl="reentrant")
    assert every.losses == plain.losses == selective.losses
    assert all(torch.isfinite(torch.tensor(plain.losses)))
    assert plain.losses != run(steps=3)[0].losses            # autocast did change the math
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain_model.parameters()))


def test_resnet_trains_and_batchnorm_stats_match_with_checkpointing():
    cfg = get_config("resnet-tiny")
    batches = ImageBatches(8, cfg.image_size, cfg.in_channels, cfg.num_classes, noise=0.5)
    models = [build_model(cfg) for _ in range(2)]
    results = [train(m, batches, 3, policy=p, seed=0, progress=False, measure_memory=False)
               for m, p in zip(models, ["none", "every"])]
    assert results[0].losses == results[1].losses
    for (name, a), b in zip(models[0].named_buffers(), models[1].buffers()):
        assert torch.equal(a, b), name
    assert int(models[1].blocks()[0].bn1.num_batches_tracked) == 3


def test_bad_arguments_raise():
    model = build_model(GPT)
    with pytest.raises(ValueError, match="valid"):
        train(model, gpt_batches(), 1, policy="sometimes", progress=False)
    with pytest.raises(ValueError, match="impl"):
        train(model, gpt_batches(), 1, policy="every", impl="magic", progress=False)
    with pytest.raises(ValueError, match="fp16.*CUDA"):
        train(model, gpt_batches(), 1, precision="fp16", progress=False)
    with pytest.raises(ValueError, match="precision"):
        train(model, gpt_batches(), 1, precision="fp8", progress=False)
    with pytest.raises(ValueError, match="micro_batches"):
        train(model, gpt_batches(), 1, micro_batches=0, progress=False)
    assert model.policy == CheckpointScheme("none")
    with pytest.raises(ValueError, match="set_policy"):
        train(torch.nn.Linear(2, 2), gpt_batches(), 1, policy="every", progress=False)


def test_policy_given_to_train_stays_on_the_model():
    model = build_model(GPT)
    train(model, gpt_batches(), 1, policy="every:2", impl="reentrant", progress=True)
    assert model.policy == CheckpointScheme("every", group=2, impl="reentrant")


def test_train_benchmark_runs_quick_and_meets_the_flop_expectation(tmp_path):
    from benchmarks.bench_train import main
    result = main(out_path=tmp_path / "train.json", quick=True)
    rows = result["policies"]
    assert (tmp_path / "train.json").exists() and set(rows) == {
        "none", "every", "every:2", "selective", "selective (torch SAC)", "save_matmuls",
        "save_matmuls (torch SAC)"}
    # PyTorch's selective checkpointing, told to save the same ops, keeps the same bytes
    for name in ("selective", "save_matmuls"):
        assert rows[f"{name} (torch SAC)"]["peak_bytes"] == rows[name]["peak_bytes"]
        assert rows[f"{name} (torch SAC)"]["step_flops"] == rows[name]["step_flops"]
    assert rows["save_matmuls"]["step_flops"] == rows["none"]["step_flops"]
    assert all(r["op_seconds"] > 0 for r in rows.values())
    # full recomputation: one more forward of the blocks (not of embedding and head)
    assert 1.2 < rows["every"]["flop_ratio"] <= 4 / 3
    assert rows["every:2"]["step_flops"] == rows["every"]["step_flops"]
    assert 1.0 < rows["selective"]["flop_ratio"] < rows["every"]["flop_ratio"]
    assert rows["every"]["peak_bytes"] < rows["every:2"]["peak_bytes"] \
        < rows["none"]["peak_bytes"]
    assert rows["selective"]["peak_bytes"] < rows["none"]["peak_bytes"]
    assert all(r["median_seconds"] > 0 for r in rows.values())
    # what re-running costs by itself: the cores sit inside the blocks, so they take less of
    # the plain step; an op-level policy re-runs no whole module and gets no such figure
    rerun = {name: r["rerun_ratio"] for name, r in rows.items()}
    assert rerun["selective"] == rerun["selective (torch SAC)"]
    assert rerun["every"] == rerun["every:2"]
    assert 1.0 < rerun["selective"] < rerun["every"] < 2.0
    assert rerun["none"] is rerun["save_matmuls"] is None
    for name in ("every", "selective", "selective (torch SAC)"):
        assert rows[name]["overhead_points"] == round(
            100 * (rows[name]["time_ratio"] - rerun[name]), 1)
