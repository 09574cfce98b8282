"""Lesson 8's reading of the committed GPU check's fragmentation section, in each state the file
can be in (absent, failed, recorded), and its figure; the section is made by the GPU check's own
loop under a stand-in allocator, so the reader follows what the check really writes."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from benchmarks import gpu_check  # noqa: E402
from ckpt_lab.lessons import gpu_results, plots  # noqa: E402


class _Allocator:
    """torch.cuda's allocator calls, answering from a script of (allocated, reserved) per step."""

    def __init__(self, monkeypatch, readings, retries):
        self.readings = iter(readings)
        self.now = (0, 0)
        for name in ("empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                     "set_per_process_memory_fraction"):
            monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self._step())
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda *a: type("P", (), {"total_memory": 10 ** 12})())
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: self.now[0])
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: self.now[1])
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 4000)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 6000)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: {"num_alloc_retries": retries})

    def _step(self):
        self.now = next(self.readings)


def _child(monkeypatch, conf, readings, retries, oom_at=None):
    """What `fragmentation_child` returns, its phases made by the GPU check's own loop."""
    cfg = gpu_check.get_config("gpt-tiny", dropout=0.0)
    model = gpu_check.build_model(cfg, "none")
    opt = torch.optim.AdamW(model.parameters())
    x, y = gpu_check.TextBatches(gpu_check.load_corpus(), 2, cfg.block_size).get(0)
    lengths = [4, 16, 8]
    _Allocator(monkeypatch, readings, retries)
    whole = gpu_check._fragmentation_phase(model, opt, x, y, lengths)
    if oom_at is not None:
        real = model.forward

        def forward(x, y):
            if x.size(1) == oom_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
            return real(x, y)
        monkeypatch.setattr(model, "forward", forward)
    capped = gpu_check._fragmentation_phase(model, opt, x, y, lengths, cap_bytes=4400)
    monkeypatch.undo()
    return {"alloc_conf": conf, "cuda": True, "lengths": lengths, "whole_device": whole,
            "capped": capped}


@pytest.fixture
def recorded(monkeypatch):
    steps = [(1000, 3000), (4000, 6000), (2000, 6000)]
    default = _child(monkeypatch, None, steps * 2, retries=2, oom_at=16)
    expandable = _child(monkeypatch, "expandable_segments:True", steps * 2, retries=0)
    return {"device": "NVIDIA H200", "fragmentation": {"default": default,
                                                        "expandable_segments": expandable}}


def test_absent_section_says_the_run_predates_it_and_how_to_record_it(monkeypatch):
    monkeypatch.setattr(gpu_results, "load", lambda name="gpu_check": {"device": "NVIDIA H200"})
    runs, line = gpu_results.fragmentation()
    assert runs is None and "H200 (committed run) predates" in line and "scripts/gpu_check.sh" in line
    monkeypatch.setattr(gpu_results, "load", lambda name="gpu_check": None)
    assert gpu_results.fragmentation() == (None, "no committed GPU run in this install; "
                                                 + gpu_results.RECORD)


def test_a_failed_or_skipped_check_is_named_not_drawn(monkeypatch):
    run = {"device": "NVIDIA H200", "fragmentation": {"default": {"error": "exit 1: boom"},
                                                       "expandable_segments": {"error": "exit 1"}}}
    monkeypatch.setattr(gpu_results, "load", lambda name="gpu_check": run)
    runs, line = gpu_results.fragmentation()
    assert runs is None and "did not run (exit 1: boom; exit 1)" in line
    run["fragmentation"] = {"skipped": "CUDA only"}
    assert "did not run (CUDA only)" in gpu_results.fragmentation()[1]


def test_recorded_section_gives_both_settings_and_what_the_cap_met(monkeypatch, recorded):
    monkeypatch.setattr(gpu_results, "load", lambda name="gpu_check": recorded)
    runs, line = gpu_results.fragmentation()
    assert list(runs) == ["default", "expandable_segments"]
    assert [s["reserved_bytes"] for s in runs["default"]["whole_device"]["steps"]] == [3000, 6000, 6000]
    assert line == ("H200 (committed run): default: peak reserved/allocated ×1.50; capped, "
                    "2 retries, out of memory · expandable_segments: peak reserved/allocated "
                    "×1.50; capped, 0 retries, all 3 steps")
    fig = plots.reserved_vs_allocated({f"H200, {s}": r["whole_device"]["steps"]
                                       for s, r in runs.items()} | {"this GPU, default": [
                                           {"seq": 8, "allocated_bytes": 2 ** 31,
                                            "reserved_bytes": 3 * 2 ** 30}]})
    h200, expandable, live = fig.axes
    assert [t.get_text() for t in h200.get_xticklabels()] == ["4", "16", "8"]
    assert h200.get_ylim() == expandable.get_ylim() != live.get_ylim()     # one scale per machine
    assert h200.get_ylabel() == "MiB" and live.get_ylabel() == "GiB"
    reserved, allocated = h200.containers
    assert [b.get_height() * 2 ** 20 for b in reserved] == pytest.approx([3000, 6000, 6000])
    assert [b.get_height() * 2 ** 20 for b in allocated] == pytest.approx([1000, 4000, 2000])
