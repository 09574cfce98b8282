"""Time and memory budget of every notebook, measured during nbval's own run (none runs twice).

For each notebook nbval starts one kernel and runs its cells in order. The wall time from the
first cell's start to the last cell's end and the kernel process's peak resident memory
(Linux VmHWM, else the largest RSS seen after a cell) are recorded; the last cell fails if the
notebook went over `BUDGET_SECONDS` or `BUDGET_BYTES`. The numbers go to
artifacts/notebook_budgets.json (git-ignored) for the README's course map.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

BUDGET_SECONDS = float(os.environ.get("CKPT_LAB_NB_BUDGET_SECONDS", 150.0))
BUDGET_BYTES = int(float(os.environ.get("CKPT_LAB_NB_BUDGET_MIB", 1024)) * 2 ** 20)
OUT = Path(os.environ.get("CKPT_LAB_NB_BUDGET_JSON", Path(__file__).resolve().parent.parent
                          / "artifacts" / "notebook_budgets.json"))
_runs: dict[str, dict] = {}


def _kernel_pid(notebook) -> int | None:
    kernel = getattr(notebook, "kernel", None)
    km = getattr(kernel, "km", None)
    provisioner = getattr(km, "provisioner", None)
    process = getattr(provisioner, "process", None)
    return getattr(process, "pid", None)


def peak_rss_bytes(pid: int) -> int:
    """Peak resident bytes of a process: VmHWM on Linux, else its current RSS."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return psutil.Process(pid).memory_info().rss


def _is_nbval(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _is_nbval(item):
        return (yield)
    name = Path(str(item.parent.path)).relative_to(Path(__file__).resolve().parent).as_posix()
    run = _runs.setdefault(name, {"start": time.perf_counter(), "peak_rss_bytes": 0})
    try:
        return (yield)
    finally:
        pid = _kernel_pid(item.parent)
        if pid is not None and psutil.pid_exists(pid):
            run["peak_rss_bytes"] = max(run["peak_rss_bytes"], peak_rss_bytes(pid))
        run["seconds"] = time.perf_counter() - run["start"]
        cells = [i for i in item.parent.session.items if i.parent is item.parent]
        if cells and item is cells[-1]:
            _write()
            over = []
            if run["seconds"] > BUDGET_SECONDS:
                over.append(f"ran {run['seconds']:.0f} s > {BUDGET_SECONDS:.0f} s")
            if run["peak_rss_bytes"] > BUDGET_BYTES:
                over.append(f"peak RSS {run['peak_rss_bytes'] / 2**20:.0f} MiB > "
                            f"{BUDGET_BYTES / 2**20:.0f} MiB")
            if over:
                raise AssertionError(f"{name} is over its budget: {'; '.join(over)}. Choose "
                                     "smaller CPU sizes with ckpt_lab.course.sizes.")


def _write():
    OUT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    for name, run in _runs.items():
        old[name] = {"seconds": round(run.get("seconds", 0.0), 2),
                     "peak_rss_mib": round(run["peak_rss_bytes"] / 2 ** 20, 1),
                     "cpu_count": psutil.cpu_count(), "measured_at": time.strftime("%Y-%m-%d %H:%M")}
    OUT.write_text(json.dumps(dict(sorted(old.items())), indent=2) + "\n")
