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
    assert all(r["allocator_peak_bytes"] is None for r in rows)      # no allocator on CPU
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
    off = result["offload"]
    assert off["pinned"] and off["copied_bytes"] == off["bytes_offloaded"] > 0
    assert off["offload_allocator_peak_bytes"] < off["plain_allocator_peak_bytes"]
    fp16 = result["precision"]["fp16"]
    assert fp16["all_finite"] and fp16["grad_scale"] > 0
    policies = result["policies"]["policies"]
    assert policies["every"]["peak_bytes"] < policies["none"]["peak_bytes"]
    assert result["tests"]["passed"] > 0 and result["notebooks"]["passed"] > 0
