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
