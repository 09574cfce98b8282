"""What every lesson notebook shares: links, device and sizes, and measured-vs-predicted checks.

* Where the course lives (`REPO_SLUG`, `BRANCH`) is written here once; the Colab and Binder
  badges of every notebook are built from it, and a test holds each notebook to its own links.
* `install_spec` is what every notebook's first cell installs where ckpt_lab is missing (Colab):
  this release, by its git tag, so a lesson saved last month keeps the library it was written
  for; `setup` then prints the device and versions the lesson will run with.
* `pick_device` and `sizes` let one notebook run in seconds on a 2-core CPU and at realistic
  sizes on a GPU, without the learner editing anything.
* `claims` checks a section's statements against measurements and prints one line (the
  table folded under it); `compare` prints one measurement next to its formula. Both fail
  loudly when they drift apart, so running the notebooks (nbval) tests the prose too.
"""
from __future__ import annotations

import sys
from importlib import metadata
from types import SimpleNamespace

import torch

import ckpt_lab
from ckpt_lab.lessons.claims import Claims, claims, ledger, table  # noqa: F401  (course.claims)
from ckpt_lab.lessons.units import GIB, MIB, fmt_bytes  # noqa: F401  (course.fmt_bytes)

REPO_SLUG = "ckpt-lab/ckpt-lab"
BRANCH = "main"
NOTEBOOK_DIR = "notebooks"

LESSONS = {
    "00_tour": "A tour: what does activation checkpointing trade?",
    "01_where_memory_goes": "Where does the memory of a training step go?",
    "02_checkpointing_from_scratch": "Checkpointing from scratch: what does it drop, and when is it wrong?",
    "03_how_many_segments": "How many segments should a chain get?",
    "04_the_price": "What does recomputation cost, in FLOPs and in time?",
    "05_transformers_selective": "Which activations grow with the sequence, and is recomputing only those worth it?",
    "06_optimal_schedules": "Where should the checkpoints go when the layers are not alike?",
    "07_combining_techniques": "Which mix of checkpointing, accumulation, bf16 and offload fits your budget at the least cost?",
    "08_capacity_and_oom": "Will Llama 2 fit on one GPU, and what makes it fit?",
    "09_checking_the_claims": "Do the two source articles hold up under measurement?",
    "10_your_own_model": "How much would checkpointing save your model, and can you trust the plan?",
    "11_checkpointing_in_your_stack": "Which switch checkpoints your model, at what cost?",
    "12_scale_out": "With D GPUs, which memory shrinks, and does checkpointing still pay?",
    "13_compile_under_a_memory_budget": "Under torch.compile, what does a memory budget buy, and what does it cost?",
    "14_the_loss_at_large_vocabularies": "At a large vocabulary, what holds the step peak, and how far can chunking the loss cut it?",
}

# ---------------------------------------------------------------------------------- links
def _notebook(name: str) -> str:
    name = name[:-len(".ipynb")] if name.endswith(".ipynb") else name
    if not name or "/" in name.strip("/").replace("solutions/", "", 1):
        raise ValueError(f"give a notebook name such as '03_how_many_segments' or "
                         f"'solutions/03_how_many_segments_solutions', got {name!r}")
    return name + ".ipynb"


def colab_url(name: str) -> str:
    """The "Open in Colab" address of notebooks/NAME.ipynb on the public repository."""
    return (f"https://colab.research.google.com/github/{REPO_SLUG}/blob/{BRANCH}/"
            f"{NOTEBOOK_DIR}/{_notebook(name)}")


def binder_url(name: str) -> str:
    """The Binder (JupyterLab) address of notebooks/NAME.ipynb on the public repository."""
    return (f"https://mybinder.org/v2/gh/{REPO_SLUG}/{BRANCH}"
            f"?urlpath=lab/tree/{NOTEBOOK_DIR}/{_notebook(name)}")


def github_url(name: str) -> str:
    """The notebook's page on GitHub."""
    return f"https://github.com/{REPO_SLUG}/blob/{BRANCH}/{NOTEBOOK_DIR}/{_notebook(name)}"


def badges_markdown(name: str) -> str:
    """Markdown for the Colab and Binder badges of one notebook."""
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(name)}) "
            f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder_url(name)})")


def lesson_links_markdown(numbers=None) -> str:
    """A Markdown list linking the lessons numbered in `numbers` (all by default), each with its
    number (each lesson carries its own Colab badge)."""
    return "\n".join(f"- {name[:2]}: [{title}]({name}.ipynb)" for name, title in LESSONS.items()
                     if numbers is None or int(name[:2]) in numbers)


def install_spec(version: str | None = None) -> str:
    """The pip requirement a notebook's first cell installs: this release's git tag."""
    return f"ckpt-lab @ git+https://github.com/{REPO_SLUG}@v{version or ckpt_lab.__version__}"


# ------------------------------------------------------------------------- device and sizes
GPU_HINT = "on Colab, Runtime > Change runtime type > a GPU (e.g. T4), then run all again"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def setup() -> None:
    """Print the device this lesson will use and the versions it runs with (first cell)."""
    device = pick_device()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = f"cuda ({props.name}, {fmt_bytes(props.total_memory)}), at the lessons' GPU sizes."
    else:
        where = f"cpu, at the lessons' small CPU sizes. For a GPU: {GPU_HINT}."
    print(f"Device: {where}\nckpt_lab {ckpt_lab.__version__}, torch {torch.__version__}, "
          f"ipywidgets {_version('ipywidgets')}, Python {sys.version.split()[0]}")

def pick_device(prefer: str | None = None) -> torch.device:
    """CUDA when present (or asked for), CPU otherwise."""
    if prefer is not None:
        dev = torch.device(prefer)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("prefer='cuda' but no CUDA device is available; use 'cpu' or None")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sizes(device: torch.device | str | None = None, **pairs) -> SimpleNamespace:
    """Pick each size for the device: ``sizes(width=(256, 2048))`` -> width 256 on CPU, 2048 on GPU."""
    gpu = pick_device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    out = {}
    for key, value in pairs.items():
        if not (isinstance(value, tuple) and len(value) == 2):
            raise ValueError(f"{key} must be a (cpu_value, gpu_value) pair, got {value!r}")
        out[key] = value[1] if gpu else value[0]
    return SimpleNamespace(**out)


def corpus_tokens() -> torch.Tensor:
    """The course's byte corpus (see `ckpt_lab.training.data.load_corpus`). Never downloads."""
    return ckpt_lab.load_corpus()


# --------------------------------------------------------------------- measured vs predicted
def compare(label: str, measured: float, predicted: float, low: float = 0.95,
            high: float = 1.05, unit: str = "bytes") -> float:
    """Print measured, predicted and their ratio; raise AssertionError if the ratio leaves
    [low, high]. Returns the ratio."""
    if predicted == 0:
        ratio = 1.0 if measured == 0 else float("inf")
    else:
        ratio = measured / predicted
    show = fmt_bytes if unit == "bytes" else (lambda v: f"{v:,.4g} {unit}")
    print(f"{label}: measured {show(measured)}, predicted {show(predicted)}, "
          f"ratio {ratio:.3f}  (allowed {low}-{high})")
    assert low <= ratio <= high, (
        f"{label}: measured/predicted = {ratio:.3f} left [{low}, {high}]; the formula and the "
        "program no longer agree, so find out which one changed")
    return ratio


def dropout_mask_bytes(device=None) -> int:
    """Bytes per element of the mask dropout saves for backward here (measured: 4 on CPU,
    where dropout multiplies by a float mask; 1 on CUDA, whose fused kernel saves a bool)."""
    x = torch.ones(8, device=device, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.nn.functional.dropout(x, 0.5, training=True)
    masks = [t for t in saved if t.shape == x.shape and t.data_ptr() != x.data_ptr()]
    if not masks:
        raise RuntimeError("dropout saved no mask; this PyTorch build saves something new")
    return masks[0].element_size()

