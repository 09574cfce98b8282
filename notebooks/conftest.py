"""Time and memory budget of every notebook, measured during nbval's own run (none runs twice).

For each notebook nbval starts one kernel and runs its cells in order. The wall time from the
first cell's start to the last cell's end and the kernel process's peak resident memory
(Linux VmHWM, else the largest RSS seen after a cell) are recorded; the last cell fails if the
notebook went over `BUDGET_SECONDS` or `BUDGET_BYTES` (1 GiB: Binder's 2 GB holds the server
and every open kernel). The numbers go to artifacts/notebook_budgets.json (git-ignored) for
the README's course map.

Every lesson of the course (`ckpt_lab.lessons.course.LESSONS`; solutions are exempt) is also
held to the lesson form there (`tools/lesson_shape`): a figure, short prose cells, little text
output, the closing sections, no answer shown above its question (printed, or stated in a
heading or prose).

The same run is saved: each notebook with the outputs nbval's kernel produced and, after its
last cell, the kernel's widget state (what JupyterLab's "Save widget state" stores) goes to
artifacts/executed/ (`CKPT_LAB_EXECUTED_DIR`), from which tools/build_site.py builds the site.
"""
from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from IPython.core.displayhook import DisplayHook

from tools import lesson_shape

BUDGET_SECONDS = float(os.environ.get("CKPT_LAB_NB_BUDGET_SECONDS", 150.0))
BUDGET_BYTES = int(float(os.environ.get("CKPT_LAB_NB_BUDGET_MIB", 1024)) * 2 ** 20)
OUT = Path(os.environ.get("CKPT_LAB_NB_BUDGET_JSON", Path(__file__).resolve().parent.parent
                          / "artifacts" / "notebook_budgets.json"))
EXECUTED_DIR = Path(os.environ.get("CKPT_LAB_EXECUTED_DIR", Path(__file__).resolve().parent.parent
                                   / "artifacts" / "executed"))
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
# Every lesson keeps the lesson form (lesson_shape.held_to_form); CKPT_LAB_LESSON_FORM=all holds
# every notebook run to it (the test of this hook uses that on a probe that is no lesson).
FORM_ALL = os.environ.get("CKPT_LAB_LESSON_FORM") == "all"
_runs: dict[str, dict] = {}
_executed: dict[str, nbformat.NotebookNode] = {}

# Run in the kernel after a notebook's last cell: print the state of every live widget.
_WIDGET_STATE_CODE = """
def _ckpt_lab_widget_state():
    import json, sys
    if "ipywidgets" not in sys.modules:
        return print("{}")
    from ipywidgets import Widget
    print(json.dumps(Widget.get_manager_state(drop_defaults=True)))
_ckpt_lab_widget_state()
del _ckpt_lab_widget_state
"""


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
        _record_outputs(name, item)
        cells = [i for i in item.parent.session.items if i.parent is item.parent]
        if cells and item is cells[-1]:
            _write()
            executed = _save_executed(name, item.parent)
            over = []
            if run["seconds"] > BUDGET_SECONDS:
                over.append(f"ran {run['seconds']:.0f} s > {BUDGET_SECONDS:.0f} s")
            if run["peak_rss_bytes"] > BUDGET_BYTES:
                over.append(f"peak RSS {run['peak_rss_bytes'] / 2**20:.0f} MiB > "
                            f"{BUDGET_BYTES / 2**20:.0f} MiB")
            failures = []
            if over:
                failures.append(f"{name} is over its budget: {'; '.join(over)}. Choose smaller "
                                "CPU sizes with ckpt_lab.lessons.course.sizes.")
            if executed is not None and (lesson_shape.held_to_form(name) or FORM_ALL):
                broken = lesson_shape.problems(executed, *lesson_shape.exercise_answers())
                if broken:
                    failures.append(f"{name} is out of the lesson form: {'; '.join(broken)}")
            if failures:
                raise AssertionError(" ".join(failures))


def _record_outputs(name: str, item):
    """Copy the outputs nbval collected for this cell into our copy of the notebook."""
    if name not in _executed:
        _executed[name] = copy.deepcopy(item.parent.nb)
    index = next(i for i, c in enumerate(item.parent.nb.cells) if c is item.cell)
    cell = _executed[name].cells[index]
    outputs = [nbformat.from_dict(dict(o)) for o in (item.test_outputs or [])]
    # nbval runs cells without storing history, so IPython cannot see a final `;` and shows
    # the value anyway; drop it as Jupyter would.
    if DisplayHook.semicolon_at_end_of_expression(cell.source):
        outputs = [o for o in outputs if o.output_type != "execute_result"]
    cell.outputs = outputs
    cell.execution_count = item.cell_num + 1


def widget_state(kernel, timeout: float = 60) -> dict:
    """The manager state of every widget alive in a running nbval kernel."""
    msg_id = kernel.execute_cell_input(_WIDGET_STATE_CODE, allow_stdin=False)
    kernel.await_reply(msg_id, timeout=timeout)
    text, errors = [], []
    while True:
        msg = kernel.get_message(stream="iopub", timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            text.append(content["text"])
        elif kind == "error":
            errors.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            break
    if errors:
        raise RuntimeError("; ".join(errors))
    return json.loads("".join(text))


def _save_executed(name: str, notebook_item):
    """Write the executed notebook, with its widget state, to EXECUTED_DIR/name; return it."""
    nb = _executed.pop(name, None)
    kernel = getattr(notebook_item, "kernel", None)
    if nb is None or kernel is None:
        return nb
    try:
        state = widget_state(kernel) if kernel.is_alive() else {}
    except Exception as err:                     # the site build refuses such a notebook
        nb.metadata["ckpt_lab_widget_state_error"] = repr(err)
        state = {}
    if state.get("state"):
        nb.metadata["widgets"] = {WIDGET_STATE_MIME: state}
    path = EXECUTED_DIR / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return nb


def _write():
    OUT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    for name, run in _runs.items():
        old[name] = {"seconds": round(run.get("seconds", 0.0), 2),
                     "peak_rss_mib": round(run["peak_rss_bytes"] / 2 ** 20, 1),
                     "cpu_count": psutil.cpu_count(), "measured_at": time.strftime("%Y-%m-%d %H:%M")}
    OUT.write_text(json.dumps(dict(sorted(old.items())), indent=2) + "\n")
