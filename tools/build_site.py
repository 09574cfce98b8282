"""Build the course site from the executed lessons: ``python tools/build_site.py EXECUTED OUT``.

EXECUTED holds the notebooks as the test run executed them (notebooks/conftest.py saves each
one nbval ran, with its outputs and widget state, to artifacts/executed/), so building the
site runs no notebook again. This script checks them, lays out a Sphinx source folder that
mirrors the repository (``index.md``, ``notebooks/``, ``notebooks/solutions/``, ``docs/``)
and runs Sphinx with myst-nb and sphinx-book-theme (configuration: tools/site/conf.py):

* each lesson is a page with its outputs, in course order (``course_map.LESSONS``) in the
  sidebar, its solutions under it, then the glossary, the decision guide and the recipe
  card (when docs/recipes.md exists); previous/next links, search, Colab and Binder buttons;
* the landing page is the course map (tools/course_map.py) with each lesson's study time,
  the run time the test run measured and its takeaways (its ``## What you now know`` bullets);
* widgets become static HTML snapshots of their saved state (sliders as their values, the
  explorer's figure as an image), so no widget JavaScript is fetched from a CDN;
* a relative link to a file the site does not hold becomes a link to it on GitHub.

Sphinx runs with warnings as errors, so a link to a missing page or glossary anchor fails the
build. Publish OUT as it is (GitHub Pages: see README).
"""
from __future__ import annotations

import argparse
import html
import posixpath
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import course_map  # noqa: E402

course = course_map.course
ROOT = course_map.ROOT
CONF_DIR = Path(__file__).resolve().parent / "site"
DOCS = ["docs/glossary.md", "docs/notation.md", "docs/decision_guide.md", "docs/architecture.md", "docs/recipes.md"]
OPTIONAL_DOCS = {"docs/recipes.md"}     # written by another part of the course; may be absent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]*)(\s+\"[^\"]*\")?\)")
_BADGE = re.compile(r"\[!\[([^\]]*)\]\(https?://[^)]*\)\]\(([^)\s]*)\)")


# ------------------------------------------------------------------------ what gets built
def pages(executed: Path) -> list[tuple[str, str, Path]]:
    """(title, page, executed notebook) of every course notebook found, in course order."""
    found = []
    for name, title in course_map.LESSONS.items():
        for page, label in ((name, title), (f"solutions/{name}_solutions", f"Solutions: {title}")):
            if (executed / f"{page}.ipynb").exists():
                found.append((label, page, executed / f"{page}.ipynb"))
    return found


def reference_pages(root: Path = ROOT) -> list[str]:
    """The pages of docs/ the site holds, in sidebar order; the recipe card only if present."""
    missing = [d for d in DOCS if d not in OPTIONAL_DOCS and not (root / d).exists()]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} in {root}")
    return [d for d in DOCS if (root / d).exists()]


def check_executed(nb, page: str) -> None:
    """Refuse a notebook that was not executed, or whose widgets have no saved state."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    if code and all(c.execution_count is None for c in code):
        raise ValueError(f"{page}.ipynb has no executed cell; run it under nbval first "
                         "(`make site`)")
    if "ckpt_lab_widget_state_error" in nb.metadata:
        raise ValueError(f"{page}.ipynb: its widget state could not be read from the kernel: "
                         f"{nb.metadata['ckpt_lab_widget_state_error']}")
    missing = {o.data[WIDGET_VIEW]["model_id"] for c in code for o in c.get("outputs", [])
               if WIDGET_VIEW in o.get("data", {})} - set(widget_models(nb))
    if missing:
        raise ValueError(f"{page}.ipynb shows widgets whose state was not saved: "
                         f"{sorted(missing)[:3]}")


# ----------------------------------------------------------------- widgets as static HTML
def widget_models(nb) -> dict:
    """The saved widget models of a notebook, by model id."""
    return nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def _buffer(model: dict, name: str) -> str | None:
    for buf in model.get("buffers", []):
        if buf.get("path") == [name]:
            return buf["data"]
    return None


def _outputs_html(outputs: list) -> str:
    parts = []
    for out in outputs:
        data = out.get("data", {})
        if "image/png" in data:
            parts.append(f'<img alt="figure" src="data:image/png;base64,{data["image/png"]}">')
        elif "text/html" in data:
            parts.append("".join(data["text/html"]))
        elif out.get("output_type") == "stream" or "text/plain" in data:
            text = out.get("text") or data.get("text/plain", "")
            parts.append(f"<pre>{html.escape(''.join(text))}</pre>")
    return "".join(parts)


def widget_html(model_id: str, models: dict) -> str:
    """One widget and its children as static HTML, from its saved state."""
    model = models.get(model_id)
    if model is None:
        raise ValueError(f"widget {model_id} has no saved state")
    kind, state = model["model_name"].removesuffix("Model"), model.get("state", {})
    children = [widget_html(ref.removeprefix("IPY_MODEL_"), models)
                for ref in state.get("children", [])]
    label = html.escape(state.get("description", ""))
    if kind in ("HBox", "VBox", "Box", "GridBox"):
        return f'<div class="ckpt-widget-{kind.lower()}">{"".join(children)}</div>'
    if "Slider" in kind or kind in ("IntText", "FloatText", "BoundedIntText", "BoundedFloatText"):
        value = state.get("value", 0)
        span = f" ({state.get('min', 0)} to {state.get('max', 100)})" if "Slider" in kind else ""
        return (f'<span class="ckpt-widget-control"><b>{label}</b> {html.escape(str(value))}'
                f'<small>{span}</small></span>')
    if kind in ("Dropdown", "ToggleButtons", "RadioButtons", "Select", "SelectionSlider"):
        labels, index = state.get("_options_labels", []), state.get("index")
        value = labels[index] if index is not None and index < len(labels) else ""
        return f'<span class="ckpt-widget-control"><b>{label}</b> {html.escape(value)}</span>'
    if kind in ("Checkbox", "ToggleButton"):
        return (f'<span class="ckpt-widget-control"><b>{label}</b> '
                f'{"on" if state.get("value") else "off"}</span>')
    if kind in ("HTML", "HTMLMath"):
        return f'<div class="ckpt-widget-html">{state.get("value", "")}</div>'
    if kind == "Label":
        return f'<span class="ckpt-widget-control">{html.escape(state.get("value", ""))}</span>'
    if kind == "Image":
        data = _buffer(model, "value")
        return (f'<img class="ckpt-widget-image" alt="figure" src="data:image/'
                f'{state.get("format", "png")};base64,{data}">' if data else "")
    if kind == "Output":
        return f'<div class="ckpt-widget-output">{_outputs_html(state.get("outputs", []))}</div>'
    return f'<span class="ckpt-widget-control">[{html.escape(kind)}]</span>'


def static_widgets(nb, launch: str) -> int:
    """Replace every widget output by a static snapshot of its saved state; returns how many."""
    models, count = widget_models(nb), 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                continue
            snapshot = widget_html(view["model_id"], models)
            out["data"] = {"text/html": (
                f'<div class="ckpt-widget">{snapshot}<p class="ckpt-widget-note">A snapshot of '
                f"this explorer as the test run left it. To move its sliders, run the lesson "
                f'({launch}).</p></div>'),
                "text/plain": out["data"].get("text/plain", "")}
            count += 1
    nb.metadata.pop("widgets", None)
    return count


# --------------------------------------------------------------------------------- links
def github_url(path: str) -> str:
    """A repository path's address on GitHub (a folder's tree, a file's blob)."""
    kind = "tree" if (ROOT / path).is_dir() else "blob"
    return f"https://github.com/{course.REPO_SLUG}/{kind}/{course.BRANCH}/{path}"


def site_links(markdown: str, page_dir: str, site_files: set[str]) -> str:
    """Point relative links written from repository folder `page_dir` at what the site holds.

    A link to a file the site builds stays relative (Sphinx makes it a page link); a link to
    any other file of the repository goes to GitHub. Badge images become plain links.
    """
    def fix(m):
        target = m.group(2)
        if not target or re.match(r"[a-z][a-z0-9+.-]*:|#|/", target, re.I):
            return m.group(0)
        path, _, fragment = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(page_dir, path))
        if repo_path in site_files or not (ROOT / repo_path).exists():
            return m.group(0)                  # a page, or a broken link Sphinx will report
        return f"{m.group(1)}({github_url(repo_path)}{'#' + fragment if fragment else ''})"
    return _LINK.sub(fix, _BADGE.sub(r"[\1](\2)", markdown))


# ---------------------------------------------------------------------------- landing page
def landing_page(entries, executed: Path, budgets: Path, docs: list[str]) -> str:
    """index.md: the course map, each lesson's launch links and takeaways, and the sidebar."""
    built = {page for _, page, _ in entries}
    rows = course_map.lessons(budgets=budgets, folders=(executed, course_map.NOTEBOOKS))
    lines = [
        "# ckpt-lab: gradient checkpointing, measured", "",
        "An interactive course on activation checkpointing, built from scratch and measured, "
        "every number set beside the formula that predicts it. Each lesson here is shown as "
        "the course's own tests executed it, with its outputs and plots; open it on Colab or "
        "Binder (the buttons at the top of each lesson), or clone "
        f"[the repository](https://github.com/{course.REPO_SLUG}), to run it yourself.", "",
        "## The course map", "",
        course_map.course_map_markdown(rows),
        "## What each lesson teaches", ""]
    for row in rows:
        nb = course_map.read_notebook(executed / f"{row.name}.ipynb") if row.name in built else None
        links = [f"[Colab]({course.colab_url(row.name)})",
                 f"[Binder]({course.binder_url(row.name)})"]
        solutions = f"solutions/{row.name}_solutions"
        if solutions in built:
            links.append(f"[solutions](notebooks/{solutions}.ipynb)")
        lines += [f"### {row.number}. [{row.title}]({row.path})", "",
                  ("" if nb else "*(not in this build)* ") + " · ".join(links), ""]
        for bullet in course_map.takeaways(nb) if nb else []:
            lines.append(f"- {course_map.rebase_links(bullet, course.NOTEBOOK_DIR)}")
        lines.append("")
    toc = [f"{r.number}. {r.title} <notebooks/{r.name}>" for r in rows if r.name in built]
    lines += _toctree("Lessons", toc) + _toctree("Reference", [d[:-3] for d in docs])
    return "\n".join(lines)


def _toctree(caption: str, entries: list[str]) -> list[str]:
    return ["```{toctree}", ":hidden:", f":caption: {caption}", "", *entries, "```", ""]


# ---------------------------------------------------------------------------------- build
def stage(executed: Path, src: Path, require=(), budgets: Path | None = None) -> list[str]:
    """Lay out the Sphinx source folder in `src`; returns the pages, in course order."""
    entries = pages(executed)
    missing = sorted(set(require) - {page for _, page, _ in entries})
    if missing:
        raise ValueError(f"no executed notebook for {missing} in {executed}; run them under "
                         "nbval first (`make site`)")
    docs = reference_pages()
    site_files = {f"{course.NOTEBOOK_DIR}/{page}.ipynb" for _, page, _ in entries} | set(docs)
    built = {page for _, page, _ in entries}
    for _, page, path in entries:
        nb = course_map.read_notebook(path)
        check_executed(nb, page)
        name = page.removeprefix("solutions/")
        static_widgets(nb, f'<a href="{course.colab_url(page)}">Colab</a>, '
                           f'<a href="{course.binder_url(page)}">Binder</a>')
        page_dir = posixpath.dirname(f"{course.NOTEBOOK_DIR}/{page}")
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = site_links(cell.source, page_dir, site_files)
        if f"solutions/{name}_solutions" in built and page == name:
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(
                _toctree("Solutions", [f"Solutions <solutions/{name}_solutions>"]))))
        target = src / course.NOTEBOOK_DIR / f"{page}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
    for doc in docs:
        target = src / doc
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / doc).read_text(encoding="utf-8")
        target.write_text(site_links(text, posixpath.dirname(doc), site_files), encoding="utf-8")
    budgets = budgets or executed.parent / course_map.BUDGETS.name
    index = landing_page(entries, executed, budgets, docs)
    (src / "index.md").write_text(site_links(index, "", site_files), encoding="utf-8")
    return [page for _, page, _ in entries]


def _clear(out: Path) -> None:
    """Empty `out` for a fresh build; refuse a folder that holds something else than a site."""
    if out.exists() and any(out.iterdir()):
        if not (out / ".buildinfo").exists() and not (out / "index.html").exists():
            raise ValueError(f"{out} exists and is not a site built here; choose another folder")
        shutil.rmtree(out)


def build(executed: Path, out: Path, require=(), budgets: Path | None = None) -> list[Path]:
    """Build the site of every executed notebook into `out`; returns the lesson pages written."""
    from sphinx.cmd.build import build_main
    _clear(out)
    with tempfile.TemporaryDirectory(prefix="ckpt-lab-site-") as tmp:
        src, log = Path(tmp) / "src", Path(tmp) / "warnings.txt"
        built = stage(executed, src, require, budgets)
        with warnings.catch_warnings():      # the toolchain's own deprecation notices
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            status = build_main(["-b", "html", "-q", "-E", "-W", "--keep-going", "-c",
                                 str(CONF_DIR), "-d", str(Path(tmp) / "doctrees"),
                                 "-w", str(log), str(src), str(Path(tmp) / "html")])
        problems = log.read_text() if log.exists() else ""
        if not status:      # built in tmp: myst-nb writes its jupyter_execute/ beside the build
            shutil.copytree(Path(tmp) / "html", out, dirs_exist_ok=True)
    if status:
        raise ValueError(f"Sphinx failed (exit {status}):\n{problems.replace(str(src), '')}")
    return [out / course.NOTEBOOK_DIR / f"{page}.html" for page in built]


def main(argv=None) -> int:
    """Command line: build the site, failing when a required notebook was not executed."""
    ap = argparse.ArgumentParser(prog="python tools/build_site.py", description=__doc__.split("\n")[0])
    ap.add_argument("executed", type=Path, help="folder of executed notebooks")
    ap.add_argument("out", type=Path, help="folder to write the site into (emptied first)")
    ap.add_argument("--require", nargs="*", default=[], help="pages that must be built")
    ap.add_argument("--require-all", action="store_true",
                    help="every lesson of the course map and every solutions notebook")
    ap.add_argument("--budgets", type=Path, default=None,
                    help="run times (default: notebook_budgets.json beside EXECUTED)")
    args = ap.parse_args(argv)
    require = list(args.require)
    if args.require_all:
        solutions = course_map.NOTEBOOKS / "solutions"
        require += list(course_map.LESSONS) + [f"solutions/{p.stem}" for p in
                                               sorted(solutions.glob("*_solutions.ipynb"))]
    start = time.perf_counter()
    try:
        written = build(args.executed, args.out, require, args.budgets)
    except ValueError as err:
        ap.exit(1, f"build_site: {err}\n")
    print(f"site: {len(written)} notebook pages, the course map and the reference pages in "
          f"{args.out}/ ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
