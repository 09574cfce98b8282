"""Lesson 9's audit of the two source articles (article 1 and article 2): how a measurement
becomes a verdict, and the one table the lesson ends with.

A verdict is never typed in: `judge_number` and `judge_range` compute it from a measured number
and the article's, by the rules the lesson states (holds: within the tolerance; partly holds:
within a factor of two; does not hold: further, or the opposite). `Audit.add` files each claim
with the article's number, what was measured on which machine, and the verdict, and returns the
verdict so the lesson can assert the one its prose states. The articles' sentences are not
copied here: each claim is the course's paraphrase, keyed by its article ("1." or "2.").
"""
from __future__ import annotations

import html
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

VERDICTS = ("holds", "partly holds", "does not hold")


# Each claim as the course paraphrases it: (article, claim, the article's number).
CLAIMS = {
    "2.no_ckpt_800": ("2", "100 layers of B×T×H keep 800 MB without checkpointing", "800 MB"),
    "2.ten_segments_90": ("2", "10 segments keep only their boundaries: a 90% cut", "90%"),
    "2.two_layers_inside": ("2", "while a segment is rebuilt, about 2 layers' activations are "
                            "alive", "2 layers"),
    "2.formula": ("2", "its sample's formula for 10 segments: 11 boundaries + 2 layers", ""),
    "2.printed": ("2", "the figure its sample prints for 10 segments", ""),
    "2.sqrt": ("2", "with √L segments, memory grows as √L, not L", "exponent 0.5"),
    "2.one_tensor": ("2", "a layer keeps one B×T×H tensor (its constant taken as 1)", "1 tensor"),
    "1.83": ("1", "48 layers in 8 segments save (L − S)/L", "83%"),
    "1.any_chain": ("1", "the saving is (L − S)/L for any chain of layers", "83% at 48/8"),
    "1.any_S": ("1", "a transformer saves (L − S)/L, whatever S", "(L − S)/L"),
    "1.O_S": ("1", "the peak is O(S) in the number of segments", "O(S)"),
    "1.densify": ("1", "short of memory, go from segments of 4 blocks to segments of 2",
                  "a lower peak"),
    "1.every4": ("1", "segments of 4 blocks are a good start for 30-80 layers", "a good start"),
    "1.selective_memory": ("1", "recomputing attention alone saves 40-60% of activation memory",
                           "40-60%"),
    "1.selective_time": ("1", "recomputing attention alone costs under 20% in speed", "< 20%"),
    "2.full_time": ("2", "checkpointing makes a step 20-40% slower", "20-40%"),
    "1.saving_cost": ("1", "a 30-50% memory saving costs 15-30% in speed", "15-30%"),
    "1.accumulation": ("1", "checkpointing with 4-8 accumulated micro-batches lowers the peak "
                       "2-4× (read as the total peak, model state included)", "2-4×"),
    "2.adam_12": ("2", "Adam's momentum and variance take 12 bytes per parameter", "12 B"),
    "2.disk": ("2", "checkpointing writes temporary files to disk", "temp files"),
    "2.conv": ("2", "checkpointing the conv of a residual block saves memory", "saves memory"),
}


def judge_number(measured: float, claimed: float, rel_tol: float = 0.05) -> str:
    """'holds' within rel_tol of the claim, 'partly holds' within a factor of 2, else not."""
    r = measured / claimed
    if abs(r - 1) <= rel_tol:
        return "holds"
    return "partly holds" if 0.5 <= r <= 2 else "does not hold"


def judge_range(measured: float, low: float, high: float) -> str:
    """'holds' inside [low, high], 'partly holds' within a factor of 2 of it, else not."""
    if low <= measured <= high:
        return "holds"
    return "partly holds" if low / 2 <= measured <= 2 * high else "does not hold"


@dataclass(frozen=True)
class Verdict:
    """One audited claim: which article, the claim paraphrased, its number, what was measured
    (and where), and the verdict."""

    source: str
    claim: str
    article: str
    measured: str
    verdict: str


class Audit:
    """The claims of both articles as the lesson decides them, in order; `where` names the
    machine of the run ("CPU here"), added to each measurement not made elsewhere."""

    def __init__(self, where: str):
        self.where = where
        self.rows: list[Verdict] = []
        self._index: dict[str, int] = {}      # claim key -> its row (a cell run twice replaces it)

    def add(self, key: str, measured: str, verdict: str, article: str | None = None,
            where: str | None = None) -> str:
        """File claim `key` of CLAIMS with what was measured; return its verdict (which the
        lesson asserts). `article` replaces the registered number, `where` the machine. Filing a
        claim again (its cell run twice) replaces its row in place."""
        if key not in CLAIMS:
            raise ValueError(f"unknown claim {key!r}; known: {sorted(CLAIMS)}")
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
        source, claim, number = CLAIMS[key]
        row = Verdict(source, claim, article or number, f"{measured} — {where or self.where}",
                      verdict)
        if key in self._index:
            self.rows[self._index[key]] = row
        else:
            self._index[key] = len(self.rows)
            self.rows.append(row)
        return verdict

    def counts(self) -> dict[str, int]:
        """How many claims got each verdict."""
        return {v: sum(r.verdict == v for r in self.rows) for v in VERDICTS}

    def summary(self) -> str:
        """One line: how many claims, and how they fared."""
        c = self.counts()
        return (f"{len(self.rows)} claims: {c['holds']} hold, {c['partly holds']} partly hold, "
                f"{c['does not hold']} do not hold")

    def text(self) -> str:
        """Every verdict, one line per claim in the order decided, then the tally."""
        width = max((len(v) for v in VERDICTS), default=0)
        lines = [f"{r.verdict:<{width}}  article {r.source}: {r.claim} (article: {r.article}; "
                 f"measured: {r.measured})" for r in self.rows]
        return "\n".join(lines + [self.summary()])

    def html(self) -> str:
        """The verdict table (claim, the article's number, what was measured where, verdict),
        then the tally under it."""
        rows = "".join(
            f"<tr><td>article {r.source}</td><td>{html.escape(r.claim)}</td>"
            f"<td>{html.escape(r.article)}</td><td>{html.escape(r.measured)}</td>"
            f"<td><b>{r.verdict}</b></td></tr>" for r in self.rows)
        return ("<table><tr><th></th><th>claim (paraphrased)</th><th>article</th>"
                f"<th>measured (where)</th><th>verdict</th></tr>{rows}</table>"
                f"<p><b>{html.escape(self.summary())}</b></p>")

    def show(self) -> None:
        """Every verdict, then the tally: a table in Jupyter, lines of text elsewhere."""
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            get_ipython = None
        if get_ipython is not None and get_ipython() is not None:
            display({"text/plain": self.text(), "text/html": self.html()}, raw=True)
        else:
            print(self.text())


def cpu_seconds(steps: dict, repeats: int = 5) -> dict:
    """Median seconds of each step function, the steps interleaved after one warm-up round.

    On a CPU: the process's CPU time with PyTorch on one thread, which other programs sharing
    the machine do not inflate. On CUDA: wall-clock time between synchronisations.
    """
    cuda = torch.cuda.is_available()
    clock = time.perf_counter if cuda else time.process_time
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        times = {name: [] for name in steps}
        for r in range(repeats + 1):
            for name, step in steps.items():
                if cuda:
                    torch.cuda.synchronize()
                start = clock()
                step()
                if cuda:
                    torch.cuda.synchronize()
                if r:
                    times[name].append(clock() - start)
    finally:
        torch.set_num_threads(threads)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


@dataclass(frozen=True)
class DiskWrites:
    """What a function wrote: bytes (Linux's write_chars, -1 where unknown), files opened for
    writing from Python, and new entries named torch* or *ckpt* in the temp directory and cwd."""

    written_bytes: int
    opened_for_write: tuple
    new_entries: tuple


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


class _OpenWatch:
    """One audit hook per process (Python cannot remove one), recording only while active."""

    def __init__(self):
        self.active, self.opened, self.installed = False, [], False

    def __call__(self, event, args):
        if self.active and event == "open" and isinstance(args[2], int) and args[2] & _WRITE_FLAGS:
            self.opened.append(str(args[0]))


_WATCH = _OpenWatch()


def _suspects() -> set:
    return {os.path.join(d, n) for d in {tempfile.gettempdir(), os.getcwd()} for n in os.listdir(d)
            if "torch" in n.lower() or "ckpt" in n.lower()}


def disk_writes(fn) -> DiskWrites:
    """Run fn() and report what it wrote to disk (see `DiskWrites`)."""
    import psutil
    proc = psutil.Process()
    counted = hasattr(proc, "io_counters")
    if not _WATCH.installed:
        sys.addaudithook(_WATCH)
        _WATCH.installed = True
    before, io0 = _suspects(), proc.io_counters().write_chars if counted else 0
    _WATCH.opened.clear()
    _WATCH.active = True
    try:
        fn()
    finally:
        _WATCH.active = False
    written = proc.io_counters().write_chars - io0 if counted else -1
    return DiskWrites(written, tuple(_WATCH.opened), tuple(sorted(_suspects() - before)))


def worst(verdicts) -> str:
    """The weakest of several verdicts (a claim that must hold everywhere is as weak as that)."""
    return max(verdicts, key=VERDICTS.index)
