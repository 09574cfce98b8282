"""The course map: lessons in order, paths through them, prerequisites, study and run times.

One source for the README's course-map section and the site's landing page
(tools/build_site.py), so the two cannot disagree:

* the lessons, in order, come from the course itself (``LESSONS``, imported once below);
* study time is computed from each notebook's content by one documented rule
  (`study_minutes`), never typed in; the README check (tests/lessons/test_readme.py) recomputes it;
* run time is what the test run measured (`artifacts/notebook_budgets.json`, written by
  notebooks/conftest.py during nbval's own run);
* takeaways are the bullets of a lesson's ``## What you now know`` section (`takeaways`).

``python tools/course_map.py --readme`` prints the README's section; ``--write`` puts it in
README.md between the two ``course-map`` markers.
"""
from __future__ import annotations

import argparse
import json
import posixpath
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:            # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from ckpt_lab.lessons import course  # noqa: E402  (the one place the lesson list is imported from)
from tools import lesson_reading  # noqa: E402

import nbformat  # noqa: E402
import nbformat.validator  # noqa: E402

LESSONS: dict[str, str] = course.LESSONS
NOTEBOOKS = ROOT / course.NOTEBOOK_DIR
BUDGETS = ROOT / "artifacts" / "notebook_budgets.json"
README = ROOT / "README.md"
GLOSSARY = "docs/glossary.md"            # relative to the repository root
NOTATION = "docs/notation.md"
START, END = "<!-- course-map:start -->", "<!-- course-map:end -->"

# ------------------------------------------------------------------------- the study-time rule
# Calibrated on a reader's measured pace: a graduate student new to the topic studied the core
# (lessons 0-5) in 7 h 30 and the whole course (13 lessons) in about 17 h, in the course as it
# stood at commit 089b199. This rule gives 7 h 30 and 17 h 45 for those notebooks (the rule it
# replaced, 150 words a minute + 1.5 min per code cell + 10 min per exercise, gave 5 h 47 and
# 13 h 30). Hidden check cells are folded: a learner reads their one result line, not their code.
WORDS_PER_MINUTE = 120          # careful reading of technical prose
SECONDS_PER_CODE_LINE = 13      # read a visible line of code, run its cell, read what it shows
MINUTES_PER_PREDICTION = 10     # predict, then read the reveal and its reason
MINUTES_PER_BUILD_TASK = 20     # write 5-25 lines, run the check, read the hint, fix
ROUND_TO = 5                    # minutes
STUDY_RULE = (f"prose words / {WORDS_PER_MINUTE} per minute + {SECONDS_PER_CODE_LINE} s per "
              f"visible line of code + {MINUTES_PER_PREDICTION} min per prediction + "
              f"{MINUTES_PER_BUILD_TASK} min per build task, rounded to {ROUND_TO} min; "
              "calibrated on a reader's measured 7 h 30 for the core")

_EXERCISE = re.compile(r"""exercises\.(?:check|predict)\(\s*["']([^"']+)["']""")
_BUILD_TASK = re.compile(r"""exercises\.check\(\s*["']([^"']+)["']""")
_LINK_TARGET = re.compile(r"(!?\[[^\]]*\])\(([^)\s]*)(\s+\"[^\"]*\")?\)")
_WORD = re.compile(r"\S*\w\S*")


def read_notebook(path: Path):
    """A notebook as nbformat v4 (older files without cell ids read without a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbformat.validator.MissingIDFieldWarning)
        return nbformat.read(path, as_version=4)


def prose_words(nb) -> int:
    """Words a learner reads in the markdown cells: link targets, images and HTML tags left out."""
    words = 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        text = re.sub(r"<!--.*?-->", " ", cell.source, flags=re.S)
        text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)             # images, badges
        text = re.sub(r"\]\([^)]*\)", "]", text)                       # keep a link's words only
        text = re.sub(r"<[^>\n]+>", " ", text)                         # HTML tags
        words += len(_WORD.findall(text))
    return words


def exercise_keys(nb) -> list[str]:
    """The exercises of a notebook: the distinct keys its code passes to `exercises.check` or
    `exercises.predict`."""
    keys = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            keys += [k for k in _EXERCISE.findall(cell.source) if k not in keys]
    return keys


def visible_code_lines(nb) -> int:
    """Lines of code a learner reads: not blank, not a comment, in cells whose input shows."""
    return sum(1 for c in nb.cells if c.cell_type == "code" and not lesson_reading.hidden(c)
               for line in c.source.splitlines()
               if line.strip() and not line.strip().startswith("#"))


def study_minutes(nb) -> int:
    """Study time of one lesson for a learner, by the rule in `STUDY_RULE`: each key passed to
    `exercises.check` is a build task, each other exercise key a prediction."""
    keys = exercise_keys(nb)
    builds = {k for c in nb.cells if c.cell_type == "code" for k in _BUILD_TASK.findall(c.source)}
    minutes = (prose_words(nb) / WORDS_PER_MINUTE
               + SECONDS_PER_CODE_LINE * visible_code_lines(nb) / 60
               + MINUTES_PER_PREDICTION * len([k for k in keys if k not in builds])
               + MINUTES_PER_BUILD_TASK * len(builds))
    return max(ROUND_TO, ROUND_TO * round(minutes / ROUND_TO))


def fmt_minutes(minutes: int) -> str:
    """'45 min', '1 h 10 min'."""
    hours, rest = divmod(minutes, 60)
    return f"{minutes} min" if not hours else f"{hours} h" + (f" {rest} min" if rest else "")


# ------------------------------------------------------------------------------ run times
def run_seconds(budgets: Path = BUDGETS) -> dict[str, float]:
    """Seconds each notebook ran in the last test run, by name ('03_x', 'solutions/03_x_solutions')."""
    if not budgets.exists():
        return {}
    data = json.loads(budgets.read_text())
    return {name.removesuffix(".ipynb"): run["seconds"] for name, run in data.items()}


# ------------------------------------------------------------------------------- takeaways
def section_bullets(nb, heading: str) -> list[str]:
    """The bullets under a markdown heading (any level) named `heading`, up to the next heading.

    A bullet's continuation lines are joined to it; the section may span several cells.
    """
    bullets, inside = [], False
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            title = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if title:
                inside = title.group(1).strip().lower() == heading.lower()
                continue
            if not inside:
                continue
            item = re.match(r"\s{0,3}[-*+]\s+(.*)", line)
            if item:
                bullets.append(item.group(1).strip())
            elif line.strip() and bullets and line.startswith((" ", "\t")):
                bullets[-1] += " " + line.strip()
    return bullets


def takeaways(nb) -> list[str]:
    """The bullets of the lesson's ``## What you now know`` section (empty when it has none)."""
    return section_bullets(nb, "What you now know")


def rebase_links(markdown: str, from_dir: str, to_dir: str = "") -> str:
    """Rewrite relative link targets written from repository folder `from_dir` for `to_dir`."""
    def fix(m):
        target = m.group(2)
        if not target or re.match(r"[a-z][a-z0-9+.-]*:|#|/", target, re.I):
            return m.group(0)
        path = posixpath.normpath(posixpath.join(from_dir, target))
        rel = posixpath.relpath(path, to_dir or ".")
        if target.endswith("/") and not rel.endswith("/"):
            rel += "/"
        return f"{m.group(1)}({rel}{m.group(3) or ''})"
    return _LINK_TARGET.sub(fix, markdown)


# ----------------------------------------------------------------------------- the course map
@dataclass(frozen=True)
class Lesson:
    """One row of the course map."""

    number: int
    name: str
    title: str
    study_minutes: int
    run_seconds: float | None

    @property
    def path(self) -> str:
        """The notebook's path in the repository."""
        return f"{course.NOTEBOOK_DIR}/{self.name}.ipynb"


def lessons(budgets: Path = BUDGETS, folders=(NOTEBOOKS,)) -> list[Lesson]:
    """Every lesson in course order, its study time from its notebook (in the first of
    `folders` that holds it), its run time from the test run's `budgets`."""
    seconds = run_seconds(budgets)
    rows = []
    for name, title in LESSONS.items():
        path = next((Path(f) / f"{name}.ipynb" for f in folders
                     if (Path(f) / f"{name}.ipynb").exists()), None)
        if path is None:
            raise FileNotFoundError(f"no {name}.ipynb in {', '.join(map(str, folders))}")
        number = int(name[:2])             # a lesson's number is its file's: 00_tour is 0
        rows.append(Lesson(number, name, title, study_minutes(read_notebook(path)),
                           seconds.get(name)))
    return rows


def _g(term: str, anchor: str) -> str:
    """A link to a glossary entry, from the repository root."""
    return f"[{term}]({GLOSSARY}#{anchor})"


# What each lesson lets you do, in one line; a term links to the glossary at its first use.
OUTCOMES = {
    "00_tour": "checkpoint a chain with PyTorch's `checkpoint_sequential`, find the "
               f"{_g('step peak', 'step-peak')} on a memory timeline, and state the price in "
               f"{_g('FLOPs', 'flops')}",
    "01_where_memory_goes": "measure and predict parameters, gradients, optimizer states "
                            f"({_g('model state', 'model-state')}, "
                            f"{_g('mixed precision', 'mixed-precision')} included) and "
                            "activations, find the step's peak moment, and tell "
                            f"{_g('tensor bytes', 'tensor-bytes')} from "
                            f"{_g('allocator bytes', 'allocator-bytes')}",
    "02_checkpointing_from_scratch": f"build the {_g('reentrant', 'reentrant')} and "
                                     f"{_g('saved-tensor-hooks', 'saved-tensor-hooks')} designs "
                                     "exact to PyTorch's bit, name the guard against each "
                                     "silent fault and where PyTorch's checkpoint lacks it, and "
                                     "predict what a checkpoint frees",
    "03_how_many_segments": "predict `checkpoint_sequential`'s peak for any number of "
                              f"{_g('segments', 'segment')} of a {_g('chain', 'chain')}, find the "
                              "best count from what a block keeps and passes on, and when more "
                              "segments save nothing",
    "04_the_price": f"predict and count a step's {_g('FLOPs', 'flops')} under any checkpoint "
                    f"plan, say what {_g('early stop', 'early-stop')} skips, and compare a step's "
                    "time ratio with its FLOP ratio, testing one reason they differ",
    "05_transformers_selective": "count what a transformer block keeps, tensor by tensor, "
                                 "against Megatron's per-layer count, checkpoint the "
                                 f"{_g('attention core', 'attention-core')} alone "
                                 f"({_g('selective recomputation', 'selective-recomputation')}), "
                                 f"and see what {_g('fused attention', 'fused-attention')} "
                                 "leaves to free",
    "06_optimal_schedules": "place checkpoints for a memory "
                            f"{_g('budget', 'budget')} (tensor or allocator bytes) with the "
                            "planner's dynamic programme on the step model (checked by "
                            f"measurement), read the {_g('Pareto front', 'pareto-front')}, and "
                            "write recursive bisection for O(log L) memory",
    "07_combining_techniques": f"predict what {_g('gradient accumulation', 'gradient-accumulation')}, "
                               f"bf16 {_g('autocast', 'autocast')} and {_g('offload', 'offload')} "
                               "do to a step's peak, alone and with checkpointing, pick the "
                               "mix that fits at the least recompute, and time it at equal "
                               f"{_g('global batch', 'global-batch')}",
    "08_capacity_and_oom": "size a model's training memory, "
                           f"{_g('model state', 'model-state')} first; pick the cheapest "
                           f"checkpointing and {_g('accumulation', 'gradient-accumulation')} "
                           "plan that fits one GPU, check the planner against a measured step, "
                           "and write an out-of-memory fallback loop",
    "09_checking_the_claims": "turn each numerical claim of the two source articles into a "
                              "measurement and a verdict, on this CPU or the committed H200 run",
    "10_your_own_model": "profile a model you bring, plan its checkpoints under a "
                         f"{_g('budget', 'budget')}, apply the plan with `torch.utils.checkpoint` "
                         "(gradients bit for bit) and check its predicted "
                         f"{_g('step peak', 'step-peak')} against a measurement",
    "11_checkpointing_in_your_stack": "checkpoint Hugging Face and any model built of "
                                      f"{_g('blocks', 'block')}, write a policy for PyTorch's "
                                      f"{_g('selective API', 'selective-activation-checkpointing')}"
                                      ", offload with `save_on_cpu`, and avoid the `use_cache` "
                                      "and reentrant-over-LoRA traps",
    "12_scale_out": f"run {_g('DDP', 'ddp')}, {_g('FSDP', 'fsdp')}2 and a "
                    f"{_g('1F1B', '1f1b')} pipeline as real processes with checkpointing, and "
                    f"predict each {_g('rank', 'rank')}'s memory",
    "13_compile_under_a_memory_budget": f"compile a training step with {_g('Inductor', 'inductor')}"
                                        " under an "
                                        f"{_g('activation memory budget', 'activation-memory-budget')}"
                                        ", measure its step peak, step time and compile time "
                                        "apart, and read what the partitioner saves from its "
                                        "graphs",
    "14_the_loss_at_large_vocabularies": "find the step peak in the loss of a large "
                                         "vocabulary, write a "
                                         f"{_g('chunked cross-entropy', 'chunked-cross-entropy')} "
                                         "exact to `F.cross_entropy`, and predict how far chunks "
                                         "cut the peak and what they cost",
}

# The paths through the course: (name, lessons, who it is for). Every lesson is on one path.
PATHS = [
    ("The core", ["00_tour", "01_where_memory_goes", "02_checkpointing_from_scratch",
                  "03_how_many_segments", "04_the_price", "05_transformers_selective"],
     "for everyone, in order. What training keeps, how checkpointing works, what it saves "
     "and what it costs"),
    ("The practitioner's lessons", ["06_optimal_schedules", "07_combining_techniques",
                                    "08_capacity_and_oom", "10_your_own_model",
                                    "11_checkpointing_in_your_stack",
                                    "13_compile_under_a_memory_budget"],
     "after the core, to make your own training fit. Plan, combine, size, apply, and the "
     "switches of the tools you use"),
    ("Optional: checking the claims", ["09_checking_the_claims"],
     "after lessons 3 and 4, for the critical reader. The source articles' numbers, measured"),
    ("Optional: large vocabularies", ["14_the_loss_at_large_vocabularies"],
     "after lesson 5, when your model's vocabulary is large (32K words and more). The loss "
     "and its chunks"),
    ("Optional: scale-out", ["12_scale_out"],
     "after lesson 7, when you train on several devices. "
     f"{_g('DDP', 'ddp')}, {_g('FSDP', 'fsdp')} and {_g('pipeline stages', 'pipeline-stage')}"),
]

# What to know before starting, each with where to learn it.
PREREQUISITES = [
    ("PyTorch autograd: what `backward()` computes and which tensors the forward saves for it",
     [("PyTorch's *Autograd mechanics*", "https://docs.pytorch.org/docs/stable/notes/autograd.html"),
      ("the *Hooks for autograd saved tensors* tutorial",
       "https://docs.pytorch.org/tutorials/intermediate/autograd_saved_tensors_hooks_tutorial.html")]),
    ("a transformer block: attention, MLP, layer norm and residuals",
     [("*The Illustrated Transformer*", "https://jalammar.github.io/illustrated-transformer/"),
      ("nanoGPT's `Block`", "https://github.com/karpathy/nanoGPT/blob/master/model.py")]),
    ("bytes per parameter in mixed-precision training (2 + 2 + 12 with Adam)",
     [("ZeRO, section 3.1", "https://arxiv.org/abs/1910.02054"),
      ("Hugging Face's *Model training anatomy*",
       "https://huggingface.co/docs/transformers/model_memory_anatomy")]),
]


def _fmt_run(seconds: float | None) -> str:
    return "not measured" if seconds is None else f"{max(1, round(seconds))} s"


def course_map_markdown(rows: list[Lesson]) -> str:
    """The course map as Markdown: prerequisites, paths and the lesson table.

    Links are relative to the repository root, where README.md and the site's landing page
    both sit.
    """
    by_name = {r.name: r for r in rows}
    lines = [
        "### Before you start", "",
        "You need Python and PyTorch basics (tensors, `nn.Module`, a training loop), and:", ""]
    for what, links in PREREQUISITES:
        lines.append(f"- {what}: " + ", ".join(f"[{t}]({u})" for t, u in links) + ".")
    lines += [
        "",
        f"Every term the course uses is defined in the [glossary]({GLOSSARY}), and every "
        f"symbol in [the notation]({NOTATION}), one meaning each. In one line: "
        f"training keeps {_g('activations', 'activation')} for backward; "
        f"{_g('activation checkpointing', 'checkpoint')} keeps only a few of them and "
        f"{_g('recomputes', 'recompute')} the rest during backward: less memory for more "
        "compute, the same gradients.", "",
        "### Paths through the course", ""]
    for name, members, who in PATHS:
        total = sum(by_name[m].study_minutes for m in members)
        numbers = ", ".join(str(by_name[m].number) for m in members)
        lines.append(f"- **{name}** (lesson{'s' if len(members) > 1 else ''} {numbers}; "
                     f"{fmt_minutes(total)} of study): {who}.")
    lines += [
        "- **In a hurry:** lessons 0, 1 and 3, then lesson 11 and the "
        "[decision guide](docs/decision_guide.md).", "",
        "### Lessons", "",
        "| # | Lesson | What you will be able to do | Study time | CPU run time |",
        "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.number} | [{r.title}]({r.path}) | {OUTCOMES[r.name]} | "
                     f"{fmt_minutes(r.study_minutes)} | {_fmt_run(r.run_seconds)} |")
    recipes = (" and the [recipe card](docs/recipes.md)"
               if (ROOT / "docs" / "recipes.md").exists() else "")
    lines += [
        "",
        f"*Study time* is computed from each notebook by one rule ({STUDY_RULE}; "
        "`tools/course_map.py`). *CPU run time* is what the test suite's own run of the "
        "notebook measured on a 2-core CPU (`artifacts/notebook_budgets.json`, rewritten on "
        "every run). Every lesson has worked solutions in `notebooks/solutions/`. Reference "
        f"pages: the [glossary]({GLOSSARY}), the [decision guide](docs/decision_guide.md) "
        f"(which switch to try first when a step does not fit){recipes}."]
    return "\n".join(lines) + "\n"


def readme_section(rows: list[Lesson]) -> str:
    """The README's course-map section, markers included."""
    return (f"{START}\n<!-- generated by `python tools/course_map.py --write`; "
            f"tests/lessons/test_readme.py checks it -->\n{course_map_markdown(rows)}{END}")


_DURATION = re.compile(r"\b(\d+) h(?: (\d+) min)?|\b(\d+) min\b")
_RUN_CELL = re.compile(r"(\d+ s|not measured)(?= \|$)", re.M)


def _minutes(text: str) -> list[int]:
    return [int(m[0] or 0) * 60 + int(m[1] or 0) + int(m[2] or 0) for m in _DURATION.findall(text)]


def _mask(text: str) -> str:
    return _RUN_CELL.sub("RUN", _DURATION.sub("TIME", text))


def readme_drift(readme: str, rows: list[Lesson], tolerance: float = 0.25) -> list[str]:
    """What in the README's course-map section no longer matches the course (empty: nothing).

    The text must equal the generated one apart from durations and run times; each duration
    (a lesson's study time, a path's total) may differ from the rule's by `tolerance` of it or
    one rounding step, whichever is more, so small edits to a lesson pass and stale tables fail.
    Run times are measurements and only have to be there.
    """
    if START not in readme or END not in readme:
        return [f"README.md has no {START} ... {END} section"]
    have = readme.split(START, 1)[1].split(END, 1)[0]
    want = readme_section(rows).split(START, 1)[1].split(END, 1)[0]
    problems = []
    diff = [(a, b) for a, b in zip(_mask(have).splitlines(), _mask(want).splitlines()) if a != b]
    if diff or len(have.splitlines()) != len(want.splitlines()):
        problems.append("the text differs from what tools/course_map.py generates"
                        + (f", first at:\n  README: {diff[0][0]}\n  now:    {diff[0][1]}" if diff else ""))
    for h, w in zip(_minutes(have), _minutes(want)):
        if abs(h - w) > max(tolerance * w, ROUND_TO):
            problems.append(f"a study time reads {fmt_minutes(h)} where the rule now gives "
                            f"{fmt_minutes(w)}")
    return problems


def readme_run_seconds(readme: str) -> dict[str, float]:
    """Run times the README's table shows now, by lesson name."""
    found = {}
    for m in re.finditer(r"^\|.*\(notebooks/(\w+)\.ipynb\).*\| (\d+) s \|$", readme, re.M):
        found[m.group(1)] = float(m.group(2))
    return found


def main(argv=None) -> int:
    """Print (--readme) or write (--write) the README's course-map section."""
    ap = argparse.ArgumentParser(prog="python tools/course_map.py", description=__doc__.split("\n")[0])
    ap.add_argument("--readme", action="store_true", help="print the README's course-map section")
    ap.add_argument("--write", action="store_true", help="replace it in README.md")
    ap.add_argument("--budgets", type=Path, default=BUDGETS, help="the test run's measurements")
    args = ap.parse_args(argv)
    rows = lessons(budgets=args.budgets)
    text = README.read_text()
    missing = [r.name for r in rows if r.run_seconds is None]
    if missing:       # keep what the README shows for lessons this run did not measure
        kept = readme_run_seconds(text)
        rows = [r if r.run_seconds is not None else
                Lesson(r.number, r.name, r.title, r.study_minutes, kept.get(r.name)) for r in rows]
        print(f"course_map: no run time in {args.budgets} for {', '.join(missing)}; kept the "
              "README's (run `make test` to measure every lesson)", file=sys.stderr)
    section = readme_section(rows)
    if args.write:
        if START not in text or END not in text:
            ap.exit(1, f"course_map: README.md has no {START} ... {END} section to replace\n")
        head, rest = text.split(START, 1)
        README.write_text(head + section + rest.split(END, 1)[1])
    elif args.readme:
        print(section)
    else:
        for r in rows:
            print(f"{r.number:>2} {r.name:<32} study {fmt_minutes(r.study_minutes):>12}  "
                  f"run {_fmt_run(r.run_seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
