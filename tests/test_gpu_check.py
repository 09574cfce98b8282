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
    for section in ("tracker_vs_allocator", "offload", "precision", "policies", "throughput"):
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
    assert [c["budget"] for c in result["throughput"]["cases"]] == ["roomy", "tight"]
    assert (tmp_path / "throughput.json").exists()
    assert "CUDA only" in result["fragmentation"]["skipped"]


def test_allocator_stats_pick_the_fragmentation_counters():
    stats = {"allocated_bytes.all.peak": 10, "reserved_bytes.all.peak": 16,
             "inactive_split_bytes.all.peak": 4, "inactive_split_bytes.all.current": 2,
             "segment.all.peak": 3, "num_alloc_retries": 1, "num_ooms": 0,
             "num_device_alloc": 5, "num_device_free": 2, "active.all.current": 99}
    got = gpu_check.allocator_stats(stats)
    assert got == {"allocated_peak_bytes": 10, "reserved_peak_bytes": 16,
                   "inactive_split_peak_bytes": 4, "inactive_split_bytes": 2,
                   "segments_peak": 3, "num_alloc_retries": 1, "num_ooms": 0,
                   "num_device_alloc": 5, "num_device_free": 2}
    assert gpu_check.allocator_stats({})["num_alloc_retries"] is None


class _FakeCuda:
    """Stands in for torch.cuda's allocator calls, so the fragmentation loop's logic runs on CPU."""

    def __init__(self, monkeypatch):
        self.fraction, self.calls = [], []
        for name in ("empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                     "synchronize"):
            monkeypatch.setattr(torch.cuda, name, lambda *a, n=name, **k: self.calls.append(n))
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                            lambda f, *a: self.fraction.append(f))
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda *a: type("P", (), {"total_memory": 1000})())
        for name, value in (("memory_allocated", 10), ("memory_reserved", 16),
                            ("max_memory_allocated", 12), ("max_memory_reserved", 20)):
            monkeypatch.setattr(torch.cuda, name, lambda *a, v=value: v)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: {"num_alloc_retries": 3})


def test_fragmentation_loop_logic_with_a_fake_allocator(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    cfg = gpu_check.get_config("gpt-tiny", dropout=0.0)
    model = gpu_check.build_model(cfg, "none")
    opt = torch.optim.AdamW(model.parameters())
    x, y = gpu_check.TextBatches(gpu_check.load_corpus(), 2, cfg.block_size).get(0)
    whole = gpu_check._fragmentation_phase(model, opt, x, y, [4, 16, 8])
    assert [s["seq"] for s in whole["steps"]] == [4, 16, 8] and whole["completed"]
    assert whole["oom"] is None and whole["num_alloc_retries"] == 3
    assert whole["max_reserved_bytes"] == 20 and fake.fraction == [1.0]

    real = model.forward

    def forward(x, y):        # the capped phase runs out of memory at the longest sequence
        if x.size(1) == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return real(x, y)
    monkeypatch.setattr(model, "forward", forward)
    capped = gpu_check._fragmentation_phase(model, opt, x, y, [4, 16, 8], cap_bytes=500)
    assert fake.fraction[-2:] == [0.5, 1.0]          # capped, then the cap lifted again
    assert [s["seq"] for s in capped["steps"]] == [4] and not capped["completed"]
    assert capped["oom"].startswith("CUDA out of memory") and capped["cap_bytes"] == 500
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the child measures for real")
def test_fragmentation_child_runs_in_a_process_with_its_own_allocator_setting(monkeypatch):
    """The harness sets PYTORCH_CUDA_ALLOC_CONF for the child (or removes an inherited one);
    on a CPU the child reports what it saw and that it has nothing to measure."""
    monkeypatch.setenv(gpu_check.ALLOC_CONF, "garbage_collection_threshold:0.6")
    expandable = gpu_check.run_child("expandable_segments:True", quick=True, timeout=120)
    default = gpu_check.run_child(None, quick=True, timeout=120)
    assert expandable["alloc_conf"] == "expandable_segments:True"
    assert default["alloc_conf"] is None
    for child in (expandable, default):
        assert child["cuda"] is False and "caching allocator is CUDA's" in child["skipped"]


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
    # Sections added after the last GPU run are checked once a run has recorded them.
    for case in result.get("throughput", {}).get("cases", []):
        fitting = [r for r in case["rows"] if r["fits"]]
        assert fitting and all(r["peak_bytes"] <= case["budget_bytes"] for r in fitting)
        assert len({r["step_flops"] for r in case["rows"] if r["policy"] == "none"}) == 1
    frag = result.get("fragmentation", {})
    for name, conf in (("default", None), ("expandable_segments", "expandable_segments:True")):
        if name in frag:
            child = frag[name]
            assert child["alloc_conf"] == conf and child["whole_device"]["completed"], child
            whole = child["whole_device"]
            assert whole["max_reserved_bytes"] >= whole["max_allocated_bytes"]
    assert result["tests"]["passed"] > 0 and result["notebooks"]["passed"] > 0
