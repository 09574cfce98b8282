"""The benchmark scripts run and write what they promise (quick sizes; timings not judged here)."""
import json

import pytest
import torch

from benchmarks import bench_checkpoint


def test_checkpoint_benchmark_writes_ratios_and_peaks_match(tmp_path):
    out = tmp_path / "checkpoint.json"
    res = bench_checkpoint.main(out_path=out, quick=True)
    assert json.loads(out.read_text()) == res
    for pair in res["ratios"].values():
        assert abs(pair["peak"] - 1) <= res["goal"]["peak_ratio_within"]
        assert pair["time"] > 0
    assert res["repeats"] >= 5


def test_compile_benchmark_writes_every_variant(tmp_path):
    from benchmarks import bench_compile
    out = tmp_path / "compile.json"
    fallback = "aot_eager_decomp_partition"
    res = bench_compile.main(out_path=out, quick=True, backends=(fallback,))
    assert json.loads(out.read_text()) == res
    assert list(res["backends"]) == [fallback] and res["machine"]["cores"] >= 1
    block = res["backends"][fallback]
    rows = block["variants"]
    assert set(rows) == set(bench_compile.VARIANTS)
    assert all(r["median_step_seconds"] > 0 and r["peak_bytes"] > 0 for r in rows.values())
    assert all(r["compile_seconds"] >= 0 and r["inductor_cache"] is None for r in rows.values())
    plain = rows["plain_compiled"]["peak_bytes"]
    for name in ("torch_checkpoint_compiled", "ckpt_lab_compiled", "memory_budget"):
        assert rows[name]["peak_bytes"] < plain, name          # each one frees activations
    kept = [rows[n]["kept_bytes"] for n in ("plain_compiled", "memory_budget",
                                            *(f"memory_budget_{b}" for b in bench_compile.SWEEP))]
    assert kept == sorted(kept, reverse=True) and kept[0] > kept[-1]   # lower budget, less kept
    assert rows["torch_checkpoint_compiled"]["graph_breaks"] == 0
    assert rows["ckpt_lab_compiled"]["graph_breaks"] >= 1      # ckpt_lab's region runs eagerly
    assert block["ckpt_lab_vs_torch_checkpoint"]["time"] > 0


def test_compile_benchmark_runs_inductor_where_a_cpp_compiler_is(tmp_path):
    """Inductor on two variants (its first compile takes tens of seconds on a small CPU)."""
    from benchmarks import bench_compile
    from ckpt_lab.lessons import compiled
    backend, why = compiled.pick_backend("cuda" if torch.cuda.is_available() else "cpu")
    res = bench_compile.main(out_path=tmp_path / "compile.json", quick=True,
                             variants=("plain_compiled", "memory_budget"))
    if backend != "inductor":                                  # said, not silently dropped
        assert res["skipped"] == {"inductor": why} and "C++" in why
        pytest.skip(why)
    assert res["skipped"] == {} and set(res["backends"]) == set(bench_compile.BACKENDS)
    inductor, fallback = (res["backends"][b]["variants"] for b in bench_compile.BACKENDS)
    for row in inductor.values():
        assert row["inductor_cache"] in ("hit", "miss") and row["compile_seconds"] > 0
        assert row["graphs"] == 1 and row["graph_breaks"] == 0
    # one partitioner: what the forward keeps does not depend on the backend
    assert {n: r["kept_bytes"] for n, r in inductor.items()} == \
        {n: r["kept_bytes"] for n, r in fallback.items()}
    # the budget keeps less; the step peak need not fall with it (lesson 13)
    assert inductor["memory_budget"]["kept_bytes"] < inductor["plain_compiled"]["kept_bytes"]


def test_losses_benchmark_writes_the_vocab_sweep(tmp_path, one_thread, monkeypatch):
    from benchmarks import bench_losses
    from benchmarks.machine import NOTES_VARIABLE
    monkeypatch.setenv(NOTES_VARIABLE, "a shared machine")
    out = tmp_path / "losses.json"
    res = bench_losses.main(out_path=out, quick=True, threads=None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert res["notes"] == "a shared machine" and res["machine"]["cores"] >= 1
    small, large = res["vocab"]
    assert large["vocab"] > small["vocab"] and large["logits_bytes"] > small["logits_bytes"]
    assert large["plain"]["peak_op"].startswith("_log_softmax_backward")
    assert all(c["peak_bytes"] < large["plain"]["peak_bytes"] for c in large["chunked"].values())


def test_throughput_benchmark_reads_each_budget(tmp_path, one_thread):
    from benchmarks import bench_throughput
    out = tmp_path / "throughput.json"
    res = bench_throughput.main(out_path=out, quick=True, threads=None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert [c["budget"] for c in res["cases"]] == ["roomy", "tight"]
    assert res["machine"]["torch"] == torch.__version__ and res["machine"]["cpu"]
    for case in res["cases"]:
        rows, read = case["rows"], case["reading"]
        fitting = [r for r in rows if r["fits"]]
        assert {r["policy"] for r in fitting} >= {"none", "every"}
        assert all(r["peak_bytes"] <= case["budget_bytes"] for r in fitting)
        assert read["checkpointed_micro_batch"] > read["plain_micro_batch"]
        # the three ratios are measured on the same rows: checkpointed/plain = gain / cost
        assert read["checkpointed_over_plain"] == pytest.approx(
            read["larger_micro_batch_gain"] / read["recompute_cost"])
        assert len({r["step_flops"] for r in rows if r["policy"] == "none"}) == 1


def test_machine_names_the_cpu_its_cores_torch_and_the_load(monkeypatch):
    from benchmarks import machine
    described = machine.describe()
    assert described["cpu"] and described["cores"] >= 1 and described["torch"] == torch.__version__
    assert described["load_average_1min"] is None or described["load_average_1min"] >= 0
    monkeypatch.delenv(machine.NOTES_VARIABLE, raising=False)
    assert machine.notes() is None
    monkeypatch.setenv(machine.NOTES_VARIABLE, "busy")
    assert machine.notes() == "busy"


def test_planner_benchmark_times_both_forms_of_the_step_model(tmp_path):
    from benchmarks import bench_planner
    out = tmp_path / "planner.json"
    res = bench_planner.main(out_path=out, quick=True)
    assert json.loads(out.read_text()) == res
    assert [r["layers"] for r in res["rows"]] == [20, 50]
    assert all(r["tables_seconds"] > 0 and r["readable_seconds"] > 0 for r in res["rows"])
