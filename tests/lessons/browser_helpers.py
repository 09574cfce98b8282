"""Drive a real Chromium through JupyterLab or Notebook 7 and check what a learner sees.

nbval runs a notebook's code but never renders it, so a slider that shows up as the text
`IntSlider(value=3)`, a plot that never redraws, or a "model not found" box would all pass it.
These helpers start a Jupyter server on a temporary copy of the notebooks, open one notebook in
Chromium (Playwright), run every cell through the UI, then look at the page: error outputs,
widget fallbacks to text, sliders that move, plots that redraw.

Every wait here waits on a state of the page or the server, never on a fixed sleep.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_INSTALL_HINT = "install it with `sudo apt-get install -y chromium` (Debian/Ubuntu)"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PROBE_SOURCE = "# browser test: proves the kernel's websocket is connected\n1 + 1"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# The text a widget falls back to when no front end renders it, e.g. `IntSlider(value=3)`.
WIDGET_AS_TEXT = re.compile(
    r"\b[A-Z]\w*(Slider|Dropdown|Button|Box|Output|Checkbox|Toggle\w*|Select\w*|Text|Play|HTML)\(")
WIDGET_ERROR_TEXT = re.compile(r"Error (displaying|creating) widget|model not found", re.I)
# Console lines (message, source URL, stack) that come from the widget manager.
WIDGET_CONSOLE_SOURCE = re.compile(
    r"@jupyter-widgets|jupyterlab-manager|ipywidgets|widget model|model not found"
    r"|(displaying|creating|rendering) widget", re.I)
# Settings a learner would never want in a test run: the "receive Jupyter news?" toast can cover
# widgets, and windowed rendering would detach cells that scroll out of view.
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def find_chromium() -> str | None:
    """Path of a Chromium binary ($CHROMIUM or Debian's), or None when none is installed."""
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium",
                      shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def uses_widgets(notebook_path: Path) -> bool:
    """Whether a code cell imports ipywidgets or ckpt_lab.lessons.widgets, or calls interact().

    Shell and magic lines (`%pip install ipywidgets`) do not count.
    """
    nb = json.loads(Path(notebook_path).read_text(encoding="utf-8"))
    code = "\n".join(line for c in nb["cells"] if c["cell_type"] == "code"
                     for line in "".join(c["source"]).splitlines()
                     if not line.lstrip().startswith(("%", "!")))
    return bool(re.search(r"^\s*(import ipywidgets|from ipywidgets\b|import ckpt_lab\.lessons\.widgets"
                          r"|from ckpt_lab\.lessons\.widgets\b"
                          r"|from ckpt_lab\.lessons import[^\n]*\bwidgets\b)"
                          r"|\binteract(ive)?\(", code, re.M))


def widget_notebooks(notebook_dir: Path) -> list[Path]:
    """The lesson notebooks in notebook_dir whose code uses widgets, sorted by name."""
    return [p for p in sorted(Path(notebook_dir).glob("*.ipynb")) if uses_widgets(p)]


def code_cell(source: str, tags: tuple[str, ...] = ()) -> dict:
    """A fresh nbformat-4 code cell."""
    return {"cell_type": "code", "execution_count": None, "id": secrets.token_hex(4),
            "metadata": {"tags": list(tags)} if tags else {}, "outputs": [], "source": source}


def write_notebook(path: Path, cells: list) -> Path:
    """Write a notebook of code cells (python3 kernel) to path; a cell is a source or (source, tags)."""
    cells = [code_cell(c) if isinstance(c, str) else code_cell(*c) for c in cells]
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                      "language": "python"},
                       "language_info": {"name": "python"}}}
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def add_probe_cell(path: Path) -> int:
    """Put a trivial probe cell first in the notebook at path; return its number of code cells."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"].insert(0, code_cell(PROBE_SOURCE))
    nb.setdefault("metadata", {}).setdefault(
        "kernelspec", {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"})
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return sum(c["cell_type"] == "code" for c in nb["cells"])


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JupyterServer:
    """A running `jupyter lab` or `jupyter notebook` serving root_dir on localhost."""

    app: str
    root_dir: Path
    port: int
    token: str
    process: subprocess.Popen
    log_path: Path

    def url(self, notebook: str) -> str:
        """The URL that opens notebook (relative to root_dir) in this server's UI."""
        route = "lab/tree" if self.app == "lab" else "notebooks"
        return f"http://127.0.0.1:{self.port}/{route}/{notebook}?token={self.token}&reset"

    def api(self, method: str, path: str):
        """Call the server's REST API; return the decoded JSON reply (None when empty)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """End every session (and its kernel), so lessons do not pile up kernels."""
        for session in self.api("GET", "sessions"):
            self.api("DELETE", f"sessions/{session['id']}")

    def stop(self) -> None:
        """Shut the server (and its kernels) down, killing it if it does not stop in 20 s."""
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def start_jupyter(app: str, root_dir: Path, state_dir: Path, timeout_s: float = 120) -> JupyterServer:
    """Start `jupyter {app}` ("lab" or "notebook") on root_dir and wait until its API answers."""
    if app not in ("lab", "notebook"):
        raise ValueError(f"app must be 'lab' or 'notebook', got {app!r}")
    state_dir.mkdir(parents=True, exist_ok=True)
    settings_dir = state_dir / "user-settings"
    for rel, values in USER_SETTINGS.items():
        (settings_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings_dir / rel).write_text(json.dumps(values), encoding="utf-8")
    env = dict(os.environ,
               JUPYTERLAB_SETTINGS_DIR=str(settings_dir),
               JUPYTERLAB_WORKSPACES_DIR=str(state_dir / "workspaces"),
               JUPYTER_CONFIG_DIR=str(state_dir / "config"),
               JUPYTER_RUNTIME_DIR=str(state_dir / "runtime"),
               JUPYTER_PLATFORM_DIRS="1", MPLBACKEND="module://matplotlib_inline.backend_inline")
    port, token = free_port(), secrets.token_hex(16)
    log_path = state_dir / f"jupyter-{app}.log"
    cmd = [sys.executable, "-m", "jupyter", app, "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--port-retries=0", f"--IdentityProvider.token={token}", "--allow-root",
           f"--ServerApp.root_dir={root_dir}"]
    if app == "lab":
        cmd.append("--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    log = open(log_path, "w")
    process = subprocess.Popen(cmd, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = JupyterServer(app, root_dir, port, token, process, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter {app} exited with {process.returncode}:\n"
                               f"{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                return server
        except OSError:
            time.sleep(0.2)  # polling the port, not waiting for the page
    server.stop()
    raise RuntimeError(f"jupyter {app} did not answer within {timeout_s} s:\n{log_path.read_text()}")


def launch_browser(playwright, chromium: str, user_data_dir: Path):
    """A headless Chromium context with a fresh profile and a tall viewport."""
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1280, "height": 1400})


@dataclass
class LessonReport:
    """What one notebook looked like in the browser."""

    notebook: str
    app: str
    problems: list[str] = field(default_factory=list)
    widgets: int = 0
    sliders: int = 0
    images_redrawn: int = 0
    moves: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    console: list[str] = field(default_factory=list)
    screenshot: Path | None = None


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll predicate until it returns a truthy value; raise TimeoutError naming what."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


# JavaScript run in the page. Prompts read "[ ]:", "[*]:" or "[7]:" in Lab and in Notebook 7.
JS_PROMPTS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'))
                     .map(e => e.textContent.trim())"""
JS_KERNEL_STATUS = """() => { const e = document.querySelector('.jp-Notebook-ExecutionIndicator');
                             return e ? e.getAttribute('data-status') : null; }"""
# What the learner sees change: a SHA-256 of each image's bytes (an Image widget gets a new blob:
# URL on every update, even for the same picture, so URLs alone would prove nothing) and the text
# of Output and HTML widgets.
JS_FINGERPRINT = """async () => {
  const nb = document.querySelector('.jp-Notebook');
  const hex = buf => Array.from(new Uint8Array(buf)).map(b => b.toString(16).padStart(2, '0')).join('');
  const imgs = [];
  for (const img of nb.querySelectorAll('.jp-OutputArea-output img')) {
    const bytes = await (await fetch(img.src)).arrayBuffer();
    imgs.push(hex(await crypto.subtle.digest('SHA-256', bytes)));
  }
  const texts = Array.from(nb.querySelectorAll('.widget-output, .widget-html, .widget-htmlmath'))
                .map(e => e.innerText);
  return {imgs, texts};
}"""
# An output node showing a widget: the widget's view (or its error box) is the node or its child.
WIDGET_OUTPUT = ".jp-OutputArea-output.jupyter-widgets, .jp-OutputArea-output:has(> .jupyter-widgets)"
# Every output node, nested ones (inside an Output widget) included. A widget node's own text is
# its error box when rendering failed; a plain node's text is what the learner reads.
JS_OUTPUT_TEXTS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea-output'))
  .map(e => ({widget: e.matches('""" + WIDGET_OUTPUT + """'), text: e.innerText,
              cell: Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))
                      .indexOf(e.closest('.jp-Cell'))}))"""
JS_DIALOGS = "() => Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText)"


def kernel_idle(page) -> bool:
    """Whether the notebook's execution indicator says the kernel is idle."""
    return page.evaluate(JS_KERNEL_STATUS) == "idle"


def accept_kernel_choice(page) -> bool:
    """Accept JupyterLab's "Select Kernel" dialog with its preselected Python 3 kernel, as a
    learner would; True if there was one. Lab asks when a notebook opens before the server's
    kernelspecs have loaded (seen on a freshly started, busy server); any other dialog stays an
    error for the caller."""
    dialogs = page.evaluate(JS_DIALOGS)
    if len(dialogs) != 1 or not dialogs[0].startswith("Select Kernel") \
            or "Python 3 (ipykernel)" not in dialogs[0]:
        return False
    page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").first.click()
    wait_until(lambda: not page.evaluate(JS_DIALOGS), 30, "the kernel dialog to close")
    return True


def run_probe_until_counted(page, timeout_s: float = 120) -> None:
    """Run the probe cell until it gets an execution count: only then is the websocket live.

    A run requested while the kernel is still starting is dropped silently (the prompt stays
    `[ ]:`); one requested before the websocket connects can stay `[*]:` forever. Both are retried.
    """
    probe = page.locator(".jp-Notebook .jp-CodeCell").first
    prompt = lambda: page.evaluate(JS_PROMPTS)[0]  # noqa: E731
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if accept_kernel_choice(page):
            continue
        wait_until(lambda: kernel_idle(page), max(1, deadline - time.monotonic()), "an idle kernel")
        if accept_kernel_choice(page):
            continue
        if dialogs := page.evaluate(JS_DIALOGS):
            raise RuntimeError(f"a dialog covers the notebook: {dialogs}")
        probe.locator(".jp-InputPrompt").click()
        page.keyboard.press("Control+Enter")
        try:
            wait_until(lambda: prompt() != "[ ]:", 3, "the probe to be queued")
            wait_until(lambda: re.fullmatch(r"\[\d+\]:", prompt()), 30, "the probe cell's count")
            return
        except TimeoutError:
            continue
    raise TimeoutError(f"the kernel never ran the probe cell within {timeout_s:.0f} s")


def click_menu(page, menu: str, item: str) -> None:
    """Click item in the top menu bar's menu (Lumino menus, same in Lab and Notebook 7)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{menu}$")).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{item}$")).first.click()


def run_all_cells(page, n_code_cells: int, timeout_s: float) -> None:
    """Run every cell from the Run menu; wait until each shows a count and the kernel is idle."""
    first_count = int(page.evaluate(JS_PROMPTS)[0][1:-2])
    click_menu(page, "Run", "Run All Cells")

    def done():
        prompts = page.evaluate(JS_PROMPTS)
        counts = [int(p[1:-2]) for p in prompts if re.fullmatch(r"\[\d+\]:", p)]
        if not counts:
            return False
        # Run All stops at an error, so "done" is an idle kernel after the probe ran again.
        finished = len(counts) == n_code_cells or ("[*]:" not in prompts and counts[0] > first_count)
        return finished and counts[0] > first_count and kernel_idle(page)

    wait_until(done, timeout_s, "all cells to run")


def save_notebook(page, path: Path, timeout_s: float = 30) -> dict:
    """Save through the UI (Ctrl+S) and return the notebook as written to disk."""
    before = path.stat().st_mtime_ns
    page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    wait_until(lambda: path.stat().st_mtime_ns != before, timeout_s, f"{path.name} to be saved")
    return wait_until(lambda: _read_json(path), 10, f"{path.name} to be complete")


def _read_json(path: Path):
    """Parsed JSON at path, or None while it is half-written."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None


def expected_error_cells(nb: dict) -> set[int]:
    """Indices of cells tagged `raises-exception` (a lesson showing an error on purpose)."""
    return {i for i, c in enumerate(nb["cells"])
            if "raises-exception" in c.get("metadata", {}).get("tags", [])}


def saved_errors(nb: dict) -> list[str]:
    """One line per unexpected error output in a saved notebook."""
    allowed = expected_error_cells(nb)
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
            for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and i not in allowed
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def rendered_problems(page, error_cells: set[int] = frozenset()) -> list[str]:
    """Widgets shown as text or as an error box, error outputs and open dialogs, as seen in the page.

    Tracebacks in error_cells (indices of cells meant to raise) are not problems.
    """
    problems = [f"dialog open: {text.strip()[:300]!r}" for text in page.evaluate(JS_DIALOGS)]
    for out in page.evaluate(JS_OUTPUT_TEXTS):
        text = (out["text"] or "").strip()
        if out["widget"]:
            if WIDGET_ERROR_TEXT.search(text) and len(text) < 300:
                problems.append(f"widget failed to render: {text!r}")
        elif WIDGET_AS_TEXT.search(text):
            problems.append(f"widget rendered as text: {text[:200]!r}")
        elif "Traceback (most recent call last)" in text and out["cell"] not in error_cells:
            problems.append(f"error output: {text[-300:]!r}")
    return problems


def slider_state(slider) -> dict:
    """Readout text and aria values of one rendered `.widget-slider`."""
    handle = slider.locator(".noUi-handle").first
    return {"readout": slider.locator(".widget-readout").first.inner_text().strip(),
            **{k: float(handle.get_attribute(f"aria-value{k}")) for k in ("now", "min", "max")}}


def drag_slider(page, slider) -> None:
    """Drag the handle about one step towards the low end (the cheaper re-measurement).

    A drag, not arrow keys: Notebook 7 swallows arrow keys in a capturing listener before the
    slider sees them, so keyboard moves work in Lab only. The step is not on the page, so the
    drag grows (one unit, a fifth, half the track) until the readout changes.
    """
    state = slider_state(slider)
    slider.scroll_into_view_if_needed()
    track = slider.locator(".noUi-target").first.bounding_box()
    unit_px = track["width"] / max(state["max"] - state["min"], 1e-9)
    sign = -1 if state["now"] > state["min"] else 1
    for dx in (max(1.5 * unit_px, 4), track["width"] / 5, track["width"] / 2):
        handle = slider.locator(".noUi-handle").first.bounding_box()
        x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + sign * dx, y, steps=4)
        page.mouse.up()
        try:
            wait_until(lambda: slider_state(slider)["readout"] != state["readout"], 2,
                       "the slider's readout to follow the drag")
            return
        except TimeoutError:
            continue
    raise TimeoutError(f"dragging the slider did not change its readout {state['readout']!r}")


def move_slider(page, slider, timeout_s: float, quiet_s: float = 5) -> tuple[dict, dict, bool]:
    """Drag the slider; return its states before/after and whether an image was redrawn.

    Raises TimeoutError when the readout does not follow the drag, or when the kernel has been
    idle for quiet_s seconds and the outputs are still what they were before the move.
    """
    before_state, before = slider_state(slider), page.evaluate(JS_FINGERPRINT)
    drag_slider(page, slider)
    last_busy = [time.monotonic()]

    def changed_or_quiet():
        if page.evaluate(JS_FINGERPRINT) != before:
            return "changed"
        if not kernel_idle(page):
            last_busy[0] = time.monotonic()
        elif time.monotonic() - last_busy[0] > quiet_s:
            return "quiet"
        return None

    outcome = wait_until(changed_or_quiet, timeout_s, "the output to change after moving the slider")
    if outcome == "quiet":
        raise TimeoutError(f"moving the slider from {before_state['readout']} changed no output "
                           f"(kernel idle for {quiet_s:.0f} s)")
    wait_until(lambda: kernel_idle(page), timeout_s, "the kernel to finish redrawing")
    after = wait_until(_stable(page), 10, "the redrawn output to settle")
    redrawn = len(after["imgs"]) >= len(before["imgs"]) > 0 and after["imgs"] != before["imgs"]
    return before_state, slider_state(slider), redrawn


def _stable(page):
    """A predicate true once two consecutive reads of the output fingerprint agree."""
    last = [None]

    def check():
        now = page.evaluate(JS_FINGERPRINT)
        same, last[0] = now == last[0], now
        return now if same else None
    return check


def check_notebook(context, server: JupyterServer, notebook: Path, artifacts_dir: Path,
                   run_timeout_s: float = 180) -> LessonReport:
    """Open notebook (inside server.root_dir) in a new page, run it, drag every slider, screenshot.

    Adds a probe cell to the notebook file first, so pass a copy. Everything a learner would see
    go wrong ends up in the report's problems; artifacts_dir gets a screenshot, the browser
    console and the report as JSON.
    """
    rel = notebook.relative_to(server.root_dir).as_posix()
    n_code_cells = add_probe_cell(notebook)
    report = LessonReport(rel, server.app)
    page = context.new_page()
    page.on("console", lambda m: report.console.append(f"{m.type}: {m.text} @ {m.location.get('url')}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: report.console.append(f"pageerror: {e.stack or e}"))
    clock = time.monotonic()

    def lap(name):
        nonlocal clock
        report.seconds[name] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()

    try:
        page.goto(server.url(rel))
        page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").first.wait_for(timeout=60_000)
        run_probe_until_counted(page)
        lap("open_and_connect")
        run_all_cells(page, n_code_cells, run_timeout_s)
        lap("run_all")
        saved = save_notebook(page, notebook)
        report.problems += saved_errors(saved)
        expected = sum(WIDGET_MIME in o.get("data", {}) for c in saved["cells"]
                       for o in c.get("outputs", []))
        wait_until(lambda: page.locator(".jp-Notebook .jupyter-widgets").count() >= expected,
                   60, f"{expected} widget outputs to render")
        report.widgets = page.locator(".jp-Notebook .jupyter-widgets").count()
        report.problems += rendered_problems(page, expected_error_cells(saved))
        sliders = page.locator(".jp-Notebook .widget-slider")
        report.sliders = sliders.count()
        for i in range(report.sliders):
            if sliders.nth(i).locator(".noUi-handle").count() != 1:
                report.problems.append(f"slider {i} has no draggable handle")
        # Drag the first slider of each displayed widget (an explorer): a slider move re-runs a
        # measurement, so every slider of every explorer would not fit the time budget.
        shown = page.locator(".jp-Notebook").locator(WIDGET_OUTPUT)
        for i in range(shown.count()):
            if shown.nth(i).locator(".widget-slider").count() == 0:
                continue
            try:
                first_slider = shown.nth(i).locator(".widget-slider").first
                before, after, redrawn = move_slider(page, first_slider, run_timeout_s)
                report.images_redrawn += redrawn
                image = "redrawn" if redrawn else "unchanged"
                report.moves.append(f"widget {i}, first slider: {before['readout']} -> "
                                    f"{after['readout']}, image {image}")
            except TimeoutError as e:
                report.problems.append(f"widget {i}, first slider: {e}")
        lap("sliders")
        # Callbacks run by the drags may have printed tracebacks into Output widgets.
        report.problems += [p for p in rendered_problems(page, expected_error_cells(saved))
                            if p not in report.problems]
        report.problems += [f"browser console: {line[:500]}" for line in report.console
                            if line.startswith(("error", "pageerror"))
                            and WIDGET_CONSOLE_SOURCE.search(line)]
    finally:
        artifacts_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{server.app}-{Path(rel).stem}"
        report.screenshot = artifacts_dir / f"{stem}.png"
        try:
            page.screenshot(path=str(report.screenshot))
        except Exception as e:  # a crashed page must not hide the error that crashed it
            report.console.append(f"screenshot failed: {e}")
        (artifacts_dir / f"{stem}-console.log").write_text("\n".join(report.console) + "\n")
        page.close()
        server.shutdown_kernels()
        (artifacts_dir / f"{stem}-report.json").write_text(json.dumps(
            {k: str(v) if isinstance(v, Path) else v for k, v in vars(report).items()
             if k != "console"}, indent=1))
    return report
