"""Lesson 1's reading of the committed GPU check: either age of its tracker-vs-allocator table.
Lesson 7's reading of the committed throughput runs: the CPU run `make bench` wrote (it names
its machine, and is the lesson's own experiment) and a GPU run where there is one."""
from dataclasses import asdict

import torch

from benchmarks import gpu_check
from ckpt_lab.lessons import committed

WORKLOADS = ("mlp-gpu none", "gpt-gpu none", "resnet-gpu none")


def test_the_committed_run_is_shown_or_said_to_lack_the_events():
    run = committed.gpu_result("gpu_check")
    rows = committed.tracker_vs_allocator(run)
    lines = committed.allocator_lines(run)
    assert len(lines) == 1 + len(WORKLOADS)
    assert ("recorded no per-op" in lines[0]) == (not all(rows[w]["events"] for w in WORKLOADS))
    for w, line in zip(WORKLOADS, lines[1:]):
        assert line.startswith(f"  {w}, batch {rows[w]['batch']}:")
        assert rows[w]["max_allocated"] >= rows[w]["tensor_peak"]   # rounding, workspaces


def test_a_run_with_the_allocator_events_gets_its_table(one_thread):
    # the rows gpu_check writes since track_memory(allocator=True), here on the CPU at tiny size
    run = {"device": "cpu", "torch": torch.__version__,
           "tracker_vs_allocator": gpu_check.tracker_vs_allocator(torch.device("cpu"), quick=True)}
    rows = committed.tracker_vs_allocator(run)
    conv = rows["resnet-tiny none"]
    assert conv["events"] and conv["allocator_peak"] > conv["tensor_peak"]
    assert conv["at_peak"] == "convolution_backward" and conv["max_allocated"] is None
    lines = committed.allocator_lines(run, workloads=("mlp-tiny none", "resnet-tiny none"))
    assert len(lines) == 3 and "recorded no per-op" not in lines[0]
    assert "convolution_backward" in lines[2] and "n/a allocated, n/a reserved" in lines[2]
    assert "(+0.0%)" in lines[1]                  # the MLP: the two numbers agree


def test_lesson_7_reads_a_throughput_run_as_the_figure_takes_it(tmp_path, one_thread):
    """committed.throughput is None until a GPU run holds the section; a run of the benchmark (here
    on the CPU at tiny size) becomes one panel per model and budget, drawn by the lesson's plot."""
    import matplotlib
    matplotlib.use("Agg")
    from benchmarks import bench_throughput
    from ckpt_lab.lessons import plots
    check = committed.gpu_result("gpu_check") or {}
    has = bool((check.get("throughput") or committed.gpu_result("throughput") or {}).get("cases"))
    assert (committed.throughput() is not None) == has
    run = bench_throughput.main(out_path=tmp_path / "throughput.json", quick=True)
    panels = committed.throughput_panels(run)
    where = f"{run['machine']['cpu']}, {run['machine']['cores']} cores (committed run)"
    assert list(panels) == [f"{where}, gpt-tiny, roomy budget", f"{where}, gpt-tiny, tight budget"]
    for (budget, rows), case in zip(panels.values(), run["cases"]):
        assert budget == case["budget_bytes"] and rows == case["rows"]
    fig = plots.throughput_panels(panels)
    assert len(fig.axes) == 2


def test_machine_label_names_the_cpu_or_the_gpu():
    assert committed.machine_label({"device": "NVIDIA H200"}) == "H200 (committed run)"
    assert committed.machine_label({"device": "cpu", "machine": {
        "cpu": "AMD EPYC", "cores": 2, "gpu": None}}) == "AMD EPYC, 2 cores (committed run)"
    assert committed.machine_label({"device": "NVIDIA H200", "machine": {
        "cpu": "Intel Xeon", "cores": 16, "gpu": "NVIDIA H200"}}) == "H200 (committed run)"


def test_the_committed_cpu_throughput_run_is_lesson_7s_experiment():
    """benchmarks/results/throughput.json (make bench, committed): the machine named, the notes
    saying how busy it was, and the gpt-cpu cases at lesson 7's CPU sizes and global batch, so
    the lesson draws it beside the learner's own run of the same experiment."""
    from ckpt_lab.lessons.exercises import lesson07
    run = committed.cpu_throughput()
    assert run is not None, "commit benchmarks/results/throughput.json from make bench"
    assert {"cpu", "cores", "torch", "load_average_1min"} <= set(run["machine"]) and run["notes"]
    cases = {c["budget"]: c for c in run["cases"] if c["model"] == "gpt-cpu"}
    assert set(cases) == {"roomy", "tight"}
    lesson_cfg = asdict(lesson07._model().config)
    for case in cases.values():
        assert case["config"] == lesson_cfg and case["global_batch"] == 16
        assert all(r["times"] and len(r["times"]) == run["repeats"] for r in case["rows"])
    assert list(committed.throughput_panels(run, model="gpt-cpu")) == [
        f"{committed.machine_label(run)}, gpt-cpu, {b} budget" for b in ("roomy", "tight")]
