"""Lesson 12 on two real processes (gloo): DDP, FSDP2 and pipeline stages give the losses and
gradients of one process on the same global batch, and each rank's bytes match
`parallel_formulas`. One launch per engine keeps the file fast."""

import pytest
import torch

from ckpt_lab import distributed, formulas, parallel_formulas as pf
from ckpt_lab.lessons import scale_out
from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config

CFG = get_config("gpt-cpu", n_layer=2, n_embd=64, n_head=2, block_size=32, dropout=0.0)
WORLD = 2
BATCH = 4


@pytest.fixture(scope="module")
def batch():
    return TextBatches(load_corpus(), BATCH, CFG.block_size).get(0)


@pytest.fixture(scope="module")
def reference(batch, one_thread):
    return scale_out.single_step(CFG, *batch)


def _act_peak(policy: str, rows: int) -> int:
    layers = formulas.gpt_layers(rows, CFG.block_size, CFG.n_layer, CFG.n_embd, CFG.n_head,
                                 CFG.vocab_size, 4, False)
    return formulas.chain_peak_bytes(layers, build_model(CFG, policy=policy).segments(),
                                     rows * CFG.block_size, CFG.vocab_size)


def _num_params() -> int:
    return sum(p.numel() for p in build_model(CFG).parameters())


@pytest.fixture(scope="module")
def ddp(batch):
    x, y = batch
    return distributed.launch(scale_out.several, [
        (scale_out.ddp_step, (CFG, x, y, "none", "hooks")),
        (scale_out.ddp_step, (CFG, x, y, "every", "reentrant", )),
        (scale_out.ddp_pitfalls, (CFG, x, y)),
        (scale_out.ddp_step, (CFG, x, y), dict(gradient_as_bucket_view=True)),
    ], world_size=WORLD, timeout=150)


def test_ddp_matches_one_process(ddp, reference):
    loss, grads = reference
    for run in ddp[0][:2]:
        assert run["loss"] == pytest.approx(loss, rel=1e-6)
        assert run["grads"].keys() == grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(run["grads"][name], g, rtol=1e-5, atol=1e-6)


def test_ddp_per_rank_bytes_match_the_formulas(ddp):
    for rank in ddp:
        plain, every = rank[0], rank[1]
        P = _num_params()
        parts = {k: plain[k] for k in ("param_bytes", "grad_bytes", "bucket_bytes",
                                       "optimizer_bytes")}
        assert parts == dict(param_bytes=4 * P, grad_bytes=4 * P, bucket_bytes=4 * P,
                             optimizer_bytes=8 * P)
        assert sum(parts.values()) == pf.ddp_state_bytes(P)
        assert plain["peak_bytes"] == _act_peak("none", BATCH // WORLD)
        # reentrant recompute holds a little more than the formula (lesson 7's tolerance)
        assert 0.98 <= every["peak_bytes"] / _act_peak("every", BATCH // WORLD) <= 1.06
        assert plain["rss_bytes"] < 2 ** 30


def test_gradient_as_bucket_view_keeps_the_gradients_in_the_buckets(ddp, reference):
    loss, grads = reference
    P = _num_params()
    for rank in ddp:
        plain, views = rank[0], rank[3]
        assert plain["grad_storages"] == len(grads)          # one storage a parameter
        assert views["grad_storages"] < len(grads)           # a few flat buckets
        assert views["grad_bytes"] == views["bucket_bytes"] == 4 * P
        # the state: weights, buckets (the gradients in them), Adam: 16 B/param, not 20
        assert views["param_bytes"] + views["bucket_bytes"] + views["optimizer_bytes"] == 16 * P
        # the bars count the buckets once: as the gradients' band
        assert views["grads_in_buckets"] and not plain["grads_in_buckets"]
        assert sum(list(scale_out.bands(views).values())[:4]) == 16 * P
    assert ddp[0][3]["loss"] == pytest.approx(loss, rel=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(ddp[0][3]["grads"][name], g, rtol=1e-5, atol=1e-6)


def test_one_process_and_a_ddp_rank_split_into_the_same_bands(ddp, batch):
    x, y = batch
    one = scale_out.bands(scale_out.one_process(CFG, x, y))
    rank = scale_out.bands(ddp[0][0])
    assert list(one) == list(rank) == list(scale_out.BANDS)
    for part in ("weights", "gradients", "Adam"):
        assert one[part] == rank[part]                      # DDP copies the state
    assert one["buckets"] == 0 and rank["buckets"] == rank["gradients"]
    assert one["activations & buffers"] == _act_peak("none", BATCH)
    assert rank["activations & buffers"] == _act_peak("none", BATCH // WORLD)


def test_reentrant_checkpoint_pitfalls_under_ddp(ddp):
    rows = {r["case"]: r for r in ddp[0][2]}
    bad = rows["torch reentrant, find_unused_parameters=True"]
    assert bad["outcome"] == "error" and "mark a variable ready only once" in bad["error"]
    frozen = rows["torch reentrant, frozen embedding"]
    assert frozen["outcome"] == "error" and "parameters that were not used" in frozen["error"]
    assert frozen["losses"], "the first step runs; the second finds the unused parameters"
    assert [r["case"] for r in ddp[0][2]][:5] == [c[0] for c in scale_out.PITFALLS[:5]]
    assert all(c[1].startswith("torch") for c in scale_out.PITFALLS[:5])  # what learners call
    for fixed in ("torch reentrant, static_graph=True", "ckpt_lab hooks, find_unused_parameters=True",
                  "torch non-reentrant, find_unused_parameters=True",
                  "torch non-reentrant, frozen embedding",
                  # ckpt_lab's reentrant node returns the parameters' gradients to the outer
                  # backward instead of accumulating them in a nested one: neither pitfall
                  "ckpt_lab reentrant, find_unused_parameters=True",
                  "ckpt_lab reentrant, frozen embedding"):
        assert rows[fixed]["outcome"] == "ok" and rows[fixed]["missing_grads"] == 0, fixed
        assert len(rows[fixed]["losses"]) == 2


FSDP_SETUPS = (scale_out.shard_layers, scale_out.ckpt_lab_then_shard,
               scale_out.checkpoint_then_shard, scale_out.one_unit, scale_out.shard_then_checkpoint)


@pytest.fixture(scope="module")
def fsdp(batch):
    x, y = batch
    out = distributed.launch(scale_out.several,
                             [(scale_out.fsdp_step, (CFG, x, y, s)) for s in FSDP_SETUPS],
                             world_size=WORLD, timeout=150)
    return [{s.__name__: run for s, run in zip(FSDP_SETUPS, rank)} for rank in out]


def test_fsdp_matches_one_process_and_shards_the_state(fsdp, reference):
    numels = [p.numel() for p in build_model(CFG).parameters()]
    for rank in fsdp:
        for case, run in rank.items():
            assert run["first_loss"] == pytest.approx(reference[0], rel=1e-6), case
            state = run["param_bytes"] + run["grad_bytes"] + run["optimizer_bytes"]
            assert state == pf.fsdp_state_bytes(numels, WORLD), case
        losses = {case: run["loss"] for case, run in rank.items()}
        assert max(losses.values()) - min(losses.values()) < 1e-5      # checkpointing: same step


def test_fsdp_per_rank_peak_matches_the_formula(fsdp):
    numels = [p.numel() for p in build_model(CFG).parameters()]
    for rank in fsdp:
        for how, policy in (("shard_layers", "none"), ("ckpt_lab_then_shard", "every"),
                            ("checkpoint_then_shard", "every")):
            run = rank[how]
            largest = max(run["unit_bytes"])
            assert run["gathered_peak_bytes"] == largest        # one unit unsharded at a time
            assert run["probe_peak_bytes"] == run["peak_bytes"]  # the probe saw the peak
            assert sum(run["at_peak"][k] for k in ("gathered", "other")) == run["peak_bytes"]
            state = pf.fsdp_state_bytes(numels, WORLD)
            predicted = pf.per_rank_peak_bytes(state, _act_peak(policy, BATCH // WORLD),
                                               pf.fsdp_unit_extra_bytes(largest))
            assert 0.9 <= (state + run["peak_bytes"]) / predicted <= 1.0, (how, run["at_peak"])
        assert rank["ckpt_lab_then_shard"]["peak_bytes"] == \
            rank["checkpoint_then_shard"]["peak_bytes"]
        # checkpointing recomputes inside the unit's backward all-gather: none extra
        assert rank["ckpt_lab_then_shard"]["all_gathers"] == rank["shard_layers"]["all_gathers"] \
            == 2 * len(rank["shard_layers"]["unit_bytes"])
        # one unit per layer of model.layers(), bottom-up; the root holds none of its own
        model = build_model(CFG)
        assert rank["shard_layers"]["unit_bytes"] == [
            4 * sum(p.numel() for p in layer.parameters()) for layer in model.layers()]
        # checkpointing after sharding: the same peak, gathers and loss as before it
        after = rank["shard_then_checkpoint"]
        for key in ("peak_bytes", "gathered_peak_bytes", "all_gathers", "loss"):
            assert after[key] == rank["checkpoint_then_shard"][key], key
        root = rank["one_unit"]
        assert root["gathered_peak_bytes"] == 4 * sum(numels)      # one unit: the whole model
        assert root["unit_bytes"] == [4 * sum(numels)] and root["all_gathers"] == 1
        bands = scale_out.bands(rank["shard_layers"])
        assert bands["buckets"] == 0
        assert bands["gathered weights"] + bands["activations & buffers"] == \
            rank["shard_layers"]["peak_bytes"]


@pytest.fixture(scope="module")
def pipe(batch):
    x, y = batch
    M = 4
    cases = [(M, "gpipe", ()), (M, "1f1b", ()), (1, "1f1b", ()),
             (M, "1f1b", [(1, 2), (2, 3)]), (M, "1f1b", [(1, 3)])]
    calls = [(scale_out.pipeline_step, (CFG, x[:BATCH // M] if m == 1 else x,
                                        y[:BATCH // M] if m == 1 else y, m, k, s))
             for m, k, s in cases]
    # the caller's own orders (GPipe's, written out) through the caller's own loop
    gpipe = [scale_out.schedule("gpipe", WORLD, r, M) for r in range(WORLD)]
    calls.append((scale_out.pipeline_step, (CFG, x, y, M), {"orders": gpipe,
                                                            "run": scale_out.run_stage}))
    out = distributed.launch(scale_out.several, calls, world_size=WORLD, timeout=150)
    return M, [dict(zip(range(len(calls)), rank)) for rank in out]


def test_pipeline_matches_one_process(pipe, reference):
    loss, grads = reference
    M, ranks = pipe
    for case in (0, 1, 3, 4):
        assert ranks[-1][case]["loss"] == pytest.approx(loss, rel=1e-6)
        for stage in ranks:
            a, b = stage[case]["layers"]
            names = [n for n in grads if a <= int(n.split(".")[1]) < b]
            assert names
            for n in names:
                torch.testing.assert_close(stage[case]["grads"][n], grads[n], rtol=1e-5,
                                           atol=1e-6)


def test_a_pipeline_runs_orders_it_is_given_as_it_runs_its_own_schedule(pipe):
    M, ranks = pipe
    for stage in ranks:
        given, own = stage[5], stage[0]                  # GPipe's orders given; GPipe's own
        for key in ("in_flight", "stash_bytes", "live_bytes", "peak_bytes", "loss"):
            assert given[key] == own[key], key
        for name, g in own["grads"].items():
            assert torch.equal(given["grads"][name], g)


@pytest.mark.parametrize("order, match", [
    ([("F", 0), ("B", 0), ("F", 1)], "runs 3 of the 4 operations"),
    ([("B", 0), ("F", 0), ("F", 1), ("B", 1)], "comes before"),
    ([("F", 0), ("F", 0), ("B", 0), ("B", 1)], "runs twice"),
    ([("F", 0), ("X", 1), ("B", 0), ("B", 1)], "is no operation"),
    ([("F", 0), ("F", 2), ("B", 0), ("B", 2)], "is no operation")])
def test_an_order_must_run_every_operation_once_backward_after_forward(order, match):
    with pytest.raises(ValueError, match=match):
        scale_out.check_order(order, 2)
    assert scale_out.check_order(scale_out.schedule("1f1b", 2, 0, 2), 2) == \
        [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_pipeline_refuses_orders_for_another_number_of_stages(batch):
    x, y = batch
    with pytest.raises(distributed.RankError, match="1 stage orders for 2 stages"):
        distributed.launch(scale_out.pipeline_step, CFG, x, y, 2, "1f1b", (),
                           [scale_out.schedule("1f1b", 2, 0, 2)], world_size=WORLD, timeout=60)


def test_pipeline_stash_and_peaks_match_the_formulas(pipe):
    M, ranks = pipe
    rows = BATCH // M
    layers = formulas.gpt_layers(rows, CFG.block_size, CFG.n_layer, CFG.n_embd, CFG.n_head,
                                 CFG.vocab_size, 4, False)
    for r, stage in enumerate(ranks):
        last = r == WORLD - 1
        for case, kind in ((0, "gpipe"), (1, "1f1b")):
            run = stage[case]
            assert run["in_flight"] == pf.in_flight(kind, WORLD, r, M)
            stash = pf.stage_stash_bytes(layers, run["spans"], rows * CFG.block_size,
                                         CFG.vocab_size, last)
            assert run["stash_bytes"][0] == stash
            predicted = pf.pipeline_peak_bytes(stage[2]["peak_bytes"], stash, run["in_flight"])
            assert 0.95 <= run["peak_bytes"] / predicted <= 1.05, (r, kind)
        for case in (0, 1):                  # live bytes after each operation of the schedule
            run = stage[case]
            assert len(run["live_bytes"]) == 2 * M and run["live_bytes"][-1] == 0
            assert max(run["live_bytes"]) <= run["peak_bytes"]
        # a checkpoint segment crossing the stage boundary is cut there
        crossing, aligned = stage[4]["spans"], stage[3]["spans"]
        assert crossing == aligned
        assert stage[4]["stash_bytes"][0] == pf.stage_stash_bytes(
            layers, crossing, rows * CFG.block_size, CFG.vocab_size, last)


@pytest.mark.parametrize("rows, m", [(5, 4), (6, 4), (3, 4), (4, 3)])
def test_pipeline_refuses_a_batch_the_micro_batches_do_not_divide_before_any_work(rows, m):
    # torch.chunk(5 rows, 4) makes 3 micro-batches (an IndexError at the 4th), (6, 4) makes
    # 2,2,2 (ditto), (4, 3) makes 2,2 and (3, 4) 1,1,1. Checked before the process group is
    # touched: this test starts no process.
    x, y = TextBatches(load_corpus(), 6, CFG.block_size).get(0)
    with pytest.raises(ValueError, match=f"{rows} rows does not split into {m} equal "
                                         "micro-batches") as info:
        scale_out.pipeline_step(CFG, x[:rows], y[:rows], m)
    assert "a micro_batches that divides" in str(info.value)
    assert "multiple of" in str(info.value)


@pytest.mark.parametrize("args, match", [
    (dict(micro_batches=0), "positive int"), (dict(micro_batches=2.0), "positive int"),
    (dict(micro_batches=True), "positive int"), (dict(kind="zigzag"), "gpipe"),
    (dict(rows_y=2), "4 rows and y has 2")])
def test_pipeline_refuses_other_bad_arguments_up_front(batch, args, match):
    x, y = batch
    y = y[:args.pop("rows_y", len(y))]
    with pytest.raises(ValueError, match=match):
        scale_out.pipeline_step(CFG, x, y, **{"micro_batches": 2, **args})


def test_data_parallel_steps_share_the_check(batch):
    # DDP and FSDP split the batch over ranks: the same check, run first on every rank
    x, y = batch
    scale_out.check_batch(x, y, 2, "shares, one per rank", "...")
    with pytest.raises(ValueError, match="4 rows does not split into 3 equal shares"):
        scale_out.check_batch(x, y, 3, "shares, one per rank", "launch a world_size")


def test_a_bad_pipeline_batch_fails_every_stage_at_once_under_launch(batch):
    x, y = TextBatches(load_corpus(), 5, CFG.block_size).get(0)
    # every stage fails at once: a stage waiting on another would end in a RankTimeout
    with pytest.raises(distributed.RankError, match="5 rows does not split into 4 equal"):
        distributed.launch(scale_out.pipeline_step, CFG, x, y, 4, world_size=WORLD, timeout=600)


def test_megatron_tensor_parallel_formula():
    s, b, h, a = 2048, 1, 12288, 96
    for t in (1, 2, 8):
        tp = pf.megatron_tp_layer_bytes(s, b, h, a, t)
        assert tp == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
        sp = pf.megatron_tp_layer_bytes(s, b, h, a, t, sequence_parallel=True)
        assert sp == pytest.approx(s * b * h / t * (34 + 5 * a * s / h))
    assert pf.megatron_tp_layer_bytes(s, b, h, a, 1) == formulas.megatron_layer_bytes(s, b, h, a)


def test_fsdp_step_refuses_a_set_up_that_is_no_function_before_any_work(batch):
    with pytest.raises(TypeError, match="prepare must be a function"):
        scale_out.fsdp_step(CFG, *batch, "torch")
