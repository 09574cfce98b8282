"""Build a static HTML site of the executed lessons: ``python tools/build_site.py EXECUTED OUT``.

EXECUTED holds notebooks as the test run executed them (notebooks/conftest.py saves each one
nbval ran, with its outputs and widget state, to artifacts/executed/), so building the site
runs no notebook again. Each notebook becomes one page with nbconvert's JupyterLab template
(outputs, plots, and the widgets as static snapshots of their last state); ``index.html``
follows the course map in ``ckpt_lab.lessons.course.LESSONS``, each lesson with its solutions.
Publish OUT as it is (GitHub Pages: see README).
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from ckpt_lab.lessons import course

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# A relative link to another notebook, e.g. (05_x.ipynb) or (../01_x.ipynb#part): point it at
# that notebook's page.
_NOTEBOOK_LINK = re.compile(r"\]\((?!https?://)([^)\s]*?)\.ipynb(#[^)\s]*)?\)")


def pages(executed: Path) -> list[tuple[str, str, Path]]:
    """(title, page name, executed notebook) of every notebook found, in course-map order."""
    found = []
    for name, title in course.LESSONS.items():
        for page, label in ((name, title), (f"solutions/{name}_solutions", f"Solutions: {title}")):
            if (executed / f"{page}.ipynb").exists():
                found.append((label, page, executed / f"{page}.ipynb"))
    return found


def check_executed(nb, page: str) -> None:
    """Refuse a notebook that was not executed, or whose widgets have no saved state."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    if code and all(c.execution_count is None for c in code):
        raise ValueError(f"{page}.ipynb has no executed cell; run it under nbval first "
                         "(`make site`)")
    if "ckpt_lab_widget_state_error" in nb.metadata:
        raise ValueError(f"{page}.ipynb: its widget state could not be read from the kernel: "
                         f"{nb.metadata['ckpt_lab_widget_state_error']}")
    views = {o.data[WIDGET_VIEW]["model_id"] for c in code for o in c.get("outputs", [])
             if WIDGET_VIEW in o.get("data", {})}
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    if views - set(state):
        raise ValueError(f"{page}.ipynb shows widgets whose state was not saved: "
                         f"{sorted(views - set(state))[:3]}")


def render(nb, exporter: HTMLExporter) -> str:
    """One executed notebook as a standalone HTML page, its notebook links made page links."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _NOTEBOOK_LINK.sub(r"](\1.html\2)", cell.source)
    body, _ = exporter.from_notebook_node(nb)
    return body


def index_html(entries: list[tuple[str, str, Path]]) -> str:
    """The index page: every lesson of the course map, with its solutions where present."""
    have = {page for _, page, _ in entries}
    rows = []
    for number, (name, title) in enumerate(course.LESSONS.items()):
        link = (f'<a href="{name}.html">{html.escape(title)}</a>' if name in have
                else html.escape(title) + " <em>(not built)</em>")
        solutions = f"solutions/{name}_solutions"
        extra = f' &middot; <a href="{solutions}.html">solutions</a>' if solutions in have else ""
        colab = f' &middot; <a href="{course.colab_url(name)}">run it on Colab</a>'
        rows.append(f"<li value=\"{number}\">{link}{extra}{colab}</li>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ckpt-lab: gradient checkpointing, measured</title>
<style>body{{font:17px/1.5 system-ui,sans-serif;max-width:46rem;margin:3rem auto;padding:0 1rem}}
li{{margin:.4rem 0}}</style></head>
<body><h1>ckpt-lab</h1>
<p>Gradient (activation) checkpointing, built from scratch and measured. Each lesson below is
shown as the course's own tests executed it on a CPU, with its outputs and plots; open it on
Colab or Binder, or clone <a href="https://github.com/{course.REPO_SLUG}">the repository</a>,
to run it yourself.</p>
<ol start="0">
{chr(10).join(rows)}
</ol>
<p>To copy into your own training code: <a href="{_doc_url("recipes.md")}">the recipes</a> (each
call with its measured cost and the lesson that derives it) and
<a href="{_doc_url("decision_guide.md")}">the decision guide</a> (which switch to try first).</p>
</body></html>
"""


def _doc_url(name: str) -> str:
    """A page of the repository's docs/ folder on GitHub (the site publishes notebooks only)."""
    return f"https://github.com/{course.REPO_SLUG}/blob/{course.BRANCH}/docs/{name}"


def build(executed: Path, out: Path, require: list[str] = ()) -> list[Path]:
    """Write every executed notebook's page and the index into ``out``; returns the pages."""
    entries = pages(executed)
    missing = sorted(set(require) - {page for _, page, _ in entries})
    if missing:
        raise ValueError(f"no executed notebook for {missing} in {executed}; run them under "
                         "nbval first (`make site`)")
    exporter = HTMLExporter(template_name="lab")
    written = []
    for title, page, path in entries:
        nb = nbformat.read(path, as_version=4)
        check_executed(nb, page)
        nb.metadata["title"] = title
        target = out / f"{page}.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(nb, exporter), encoding="utf-8")
        written.append(target)
    (out / "index.html").write_text(index_html(entries), encoding="utf-8")
    (out / ".nojekyll").write_text("")          # GitHub Pages: serve the files as they are
    return written


def main(argv=None) -> int:
    """Command line: build the site, failing when a required notebook was not executed."""
    ap = argparse.ArgumentParser(prog="python tools/build_site.py", description=__doc__.split("\n")[0])
    ap.add_argument("executed", type=Path, help="folder of executed notebooks")
    ap.add_argument("out", type=Path, help="folder to write the site into")
    ap.add_argument("--require", nargs="*", default=[], help="pages that must be built")
    ap.add_argument("--require-all", action="store_true",
                    help="every lesson of the course map and every solutions notebook")
    args = ap.parse_args(argv)
    require = list(args.require)
    if args.require_all:
        solutions = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"
        require += list(course.LESSONS) + [f"solutions/{p.stem}" for p in
                                           sorted(solutions.glob("*_solutions.ipynb"))]
    try:
        written = build(args.executed, args.out, require)
    except ValueError as err:
        ap.exit(1, f"build_site: {err}\n")
    print(f"site: {len(written)} pages and index.html in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
