"""Claims a lesson makes, checked against measurements and shown as one line.

A lesson proves what it says, but a wall of "measured X, predicted X, ratio 1.000" lines
teaches little after the tenth. A section collects its checks in one block::

    with course.claims("kept bytes") as c:
        c.ratio("kept by 4 plain blocks", measured, predicted, 0.999, 1.001)
        c.equal("gradients, ckpt_lab vs plain", grads, plain_grads)
        c.true("the peak falls with segments", peaks == sorted(peaks, reverse=True))

Each check asserts at once: a failing claim raises ``AssertionError`` with its full line, so
nbval fails the notebook. When the block ends, it prints a single line
(``✓ 3 claims hold (kept bytes) · measured/predicted 0.999–1.000``) and, in Jupyter, the full
table folded in a ``<details>`` element under it. `ledger` prints a lesson's key numbers as one
compact table.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import torch

from ckpt_lab.lessons.units import fmt_bytes


@dataclass
class Claim:
    """One checked statement: its label, what was measured and predicted, and the verdict."""

    label: str
    measured: str
    predicted: str
    verdict: str
    ratio: float | None = None


def _show(value, unit: str) -> str:
    if isinstance(value, str):
        return value
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:,.4g}{' ' + unit if unit else ''}"


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@dataclass
class Claims:
    """The claims of one section; use as ``with course.claims(title) as c:``."""

    title: str = ""
    claims: list[Claim] = field(default_factory=list)

    def ratio(self, label: str, measured: float, predicted: float, low: float = 0.95,
              high: float = 1.05, unit: str = "bytes") -> float:
        """Assert measured/predicted lies in [low, high]; return the ratio."""
        if predicted == 0:
            ratio = 1.0 if measured == 0 else float("inf")
        else:
            ratio = measured / predicted
        line = (f"{label}: measured {_show(measured, unit)}, predicted {_show(predicted, unit)}, "
                f"ratio {ratio:.3f} (allowed {low}–{high})")
        assert low <= ratio <= high, (
            f"{line}. The formula and the program no longer agree: find out which one changed.")
        self.claims.append(Claim(label, _show(measured, unit), _show(predicted, unit),
                                 f"{ratio:.3f}", ratio))
        return ratio

    def equal(self, label: str, measured, expected) -> None:
        """Assert two results are equal: tensors bit for bit, containers element by element."""
        assert _same(measured, expected), f"{label}: not equal (measured {measured!r:.200})"
        self.claims.append(Claim(label, "equal", "equal", "exact"))

    def true(self, label: str, condition: bool, detail: str = "") -> None:
        """Assert a statement the prose makes (a shape, an order, a sign); `detail` shows why."""
        assert condition, f"{label}: does not hold. {detail}".strip()
        self.claims.append(Claim(label, detail or "holds", "", "holds"))

    def summary(self) -> str:
        """The one line a section prints."""
        ratios = [c.ratio for c in self.claims if c.ratio is not None]
        title = f" ({self.title})" if self.title else ""
        n = len(self.claims)
        line = f"✓ {n} claim{'s' if n != 1 else ''} hold{'s' if n == 1 else ''}{title}"
        if ratios:
            low, high = min(ratios), max(ratios)
            span = f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}–{high:.3f}"
            line += f" · measured/predicted {span}"
        return line

    def html(self) -> str:
        """The summary line with every claim in a folded table."""
        rows = "".join(
            f"<tr><td>{html.escape(c.label)}</td><td>{html.escape(c.measured)}</td>"
            f"<td>{html.escape(c.predicted)}</td><td>{html.escape(c.verdict)}</td></tr>"
            for c in self.claims)
        return (f"<details><summary>{html.escape(self.summary())}</summary><table>"
                "<tr><th>claim</th><th>measured</th><th>predicted</th><th>ratio</th></tr>"
                f"{rows}</table></details>")

    def report(self) -> None:
        """Show the summary: one text line, and the folded table where HTML renders."""
        _display(self.summary(), self.html())

    def __enter__(self) -> "Claims":
        return self

    def __exit__(self, kind, value, tb) -> bool:
        if kind is None:
            if not self.claims:
                raise AssertionError(f"claims({self.title!r}) checked nothing")
            self.report()
        return False


def claims(title: str = "") -> Claims:
    """A block of checked claims for one section (see the module docstring)."""
    return Claims(title)


def ledger(title: str, rows: dict[str, str]) -> None:
    """A lesson's key numbers as one compact table (text and HTML)."""
    width = max(map(len, rows))
    text = "\n".join([title] + [f"  {k:<{width}}  {v}" for k, v in rows.items()])
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in rows.items())
    _display(text, f"<b>{html.escape(title)}</b><table>{body}</table>")


def table(title: str, columns: list[str], rows: list[list]) -> None:
    """Rows under named columns, as one table (text and HTML)."""
    cells = [[str(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(f"{v:>{w}}" for v, w in zip(vals, widths))  # noqa: E731
    text = "\n".join([title, line(columns)] + [line(r) for r in cells])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>"
                   for r in cells)
    markup = f"<b>{html.escape(title)}</b><table><tr>{head}</tr>{body}</table>"
    _display(text, markup, plain=f"{title} ({len(rows)} rows, shown as a table)")


def _display(text: str, markup: str, plain: str | None = None) -> None:
    """`markup` in a notebook (with `plain`, default `text`, for text-only views), else `text`."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": plain or text, "text/html": markup}, raw=True)
    else:
        print(text)
