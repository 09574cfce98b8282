"""The benchmark scripts run and write what they promise (quick sizes; timings not judged here)."""
import json

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
    res = bench_compile.main(out_path=out, quick=True)
    assert json.loads(out.read_text()) == res
    rows = res["variants"]
    assert set(rows) == set(bench_compile.VARIANTS)
    assert all(r["median_step_seconds"] > 0 and r["peak_bytes"] > 0 for r in rows.values())
    plain = rows["plain_compiled"]["peak_bytes"]
    for name in ("torch_checkpoint_compiled", "ckpt_lab_compiled", "memory_budget"):
        assert rows[name]["peak_bytes"] < plain, name          # each one frees activations
    assert rows["torch_checkpoint_compiled"]["graph_breaks"] == 0
    assert rows["ckpt_lab_compiled"]["graph_breaks"] >= 1      # ckpt_lab's region runs eagerly
    assert res["ckpt_lab_vs_torch_checkpoint"]["time"] > 0
