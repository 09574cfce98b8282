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


def test_losses_benchmark_writes_the_vocab_sweep(tmp_path, one_thread):
    from benchmarks import bench_losses
    out = tmp_path / "losses.json"
    res = bench_losses.main(out_path=out, quick=True, threads=None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    small, large = res["vocab"]
    assert large["vocab"] > small["vocab"] and large["logits_bytes"] > small["logits_bytes"]
    assert large["plain"]["peak_op"].startswith("_log_softmax_backward")
    assert all(c["peak_bytes"] < large["plain"]["peak_bytes"] for c in large["chunked"].values())
