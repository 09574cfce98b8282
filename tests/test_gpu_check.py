"""The GPU check's logic, run on the CPU at tiny sizes, and the committed GPU results' invariants."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "gpu" / "gpu_check.json"


@pytest.mark.skipif(torch.cuda.is_available(), reason="scripts/gpu_check.sh runs it at GPU size")
def test_quick_run_on_cpu_fills_every_section(tmp_path, one_thread):
    result = gpu_check.main(tmp_path / "gpu_check.json", quick=True)
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == json.loads(
        json.dumps(result, default=str))
    for section in ("tracker_vs_allocator", "offload", "precision", "policies"):
        assert "error" not in result[section], result[section]
    rows = result["tracker_vs_allocator"]
    assert len(rows) == 6 and all(r["tracked_peak_bytes"] > 0 for r in rows)
    for r in rows:
        # allocator=True leaves the tracker's count alone; the allocator sees at least as much
        assert r["tracked_peak_bytes_allocator_mode"] == r["tracked_peak_bytes"], r
        assert r["allocator_peak_bytes"] >= r["tracked_peak_bytes"], r
        assert r["tracked_peak_bytes"] <= r["tracked_with_transients_bytes"], r
        assert r["max_memory_allocated_bytes"] is None and r["memory_reserved_bytes"] is None
        # the gap, split at the allocator's peak: op temporaries + what no storage explains
        split = r["at_allocator_peak"]
        assert split["tracked_bytes"] + split["transient_bytes"] + split["untracked_bytes"] \
            == r["allocator_peak_bytes"], r
    convs = [r for r in rows if r["workload"].startswith("resnet")]
    assert all(r["top_transients"][0]["op"].startswith("convolution_backward") for r in convs)
    assert all(r["allocator_peak_bytes"] > r["tracked_peak_bytes"] for r in convs)
    off = result["offload"]
    assert off["grads_equal"] and off["plain_repeat_grads_equal"]   # CPU fp32: bitwise
    assert off["torch_save_on_cpu_grads_equal"]
    assert off["bytes_offloaded"] > 0 and off["copied_bytes"] == 0   # accounting mode
    assert set(result["precision"]) >= {"fp32", "bf16"} and "fp16" not in result["precision"]
    assert result["precision"]["fp32"]["all_finite"]
    assert set(result["policies"]["policies"]) >= {"none", "every", "selective"}
    assert (tmp_path / "train.json").exists()


def test_script_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"
    run = subprocess.run(["bash", str(script), "/tmp/ckpt_lab_gpu_check_unused"],
                         env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no CUDA device" in run.stdout


def test_committed_gpu_results_are_consistent():
    result = json.loads(RESULTS.read_text())
    assert result["cuda"] is not None      # measured on a CUDA machine
    for row in result["tracker_vs_allocator"]:
        # the allocator holds every tensor track_memory counts, plus rounding and workspaces
        assert row["allocator_peak_bytes"] >= row["tracked_peak_bytes"], row
        assert row["allocator_over_tracked"] < 1.5, row
        if "max_memory_allocated_bytes" in row:   # written since track_memory(allocator=True)
            assert row["tracked_peak_bytes_allocator_mode"] == row["tracked_peak_bytes"], row
            # its replay of the allocator's events is torch.cuda's own count, within 1%
            assert abs(row["max_memory_allocated_over_allocator_peak"] - 1) <= 0.01, row
            assert row["max_memory_reserved_bytes"] >= row["max_memory_allocated_bytes"], row
    off = result["offload"]
    assert off["pinned"] and off["copied_bytes"] == off["bytes_offloaded"] > 0
    assert off["offload_allocator_peak_bytes"] < off["plain_allocator_peak_bytes"]
    fp16 = result["precision"]["fp16"]
    assert fp16["all_finite"] and fp16["grad_scale"] > 0
    policies = result["policies"]["policies"]
    assert policies["every"]["peak_bytes"] < policies["none"]["peak_bytes"]
    assert result["tests"]["passed"] > 0 and result["notebooks"]["passed"] > 0
