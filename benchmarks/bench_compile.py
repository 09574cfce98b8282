"""A compiled training step with checkpointing, on both compile backends: Inductor and
``aot_eager_decomp_partition``.

One small model from ``ckpt_lab.training.models`` (an MLP chain on a CPU, where Inductor's C++ compile
of a transformer takes minutes; GPT-2 small sizes on CUDA), under ``torch.compile``:

* ``plain_eager`` / ``plain_compiled``: no checkpoint, without and with compile;
* ``torch_checkpoint_compiled``: ``torch.utils.checkpoint(..., use_reentrant=False)`` per block
  (``impl="torch"``), which Dynamo traces as a higher-order op: compiled, recomputed by the
  partitioner;
* ``ckpt_lab_compiled``: ``ckpt_lab.checkpoint`` per block. It is excluded from Dynamo, so
  each call is a graph break: the blocks run eagerly, the code between them is compiled;
* ``ckpt_lab_eager``: the same without compile, to read what the breaks cost;
* ``memory_budget`` and ``memory_budget_<b>``: no checkpoint, compile's own recomputation
  (``torch._functorch.config.activation_memory_budget``) at 0.5 and down the `SWEEP`.

Each backend compiles every variant anew (its own code object: `compiled.own_code`). Inductor
runs where it can build kernels (CUDA, or a C++ compiler on the CPU:
``compiled.pick_backend``); where it cannot, the JSON says why under ``skipped``. For each
variant, measured by ``ckpt_lab.lessons.compiled.compare`` (lesson 13 measures its compiled
steps with the same function): the compile time apart (the first step's time less a median
step; ``inductor_cache`` says whether Inductor compiled or loaded the graph from its on-disk
cache), the median step time over paired repeats in a rotating order after warm-up steps, the
bytes a forward leaves for the backward and the step peak (activations), from the
allocator's events (``ckpt_lab.measure.allocator.profiled_memory``: compiled code runs eagerly under
``track_memory``'s dispatch mode, so that tracker cannot measure it), and the graphs and graph
breaks Dynamo made.

Run: python -m benchmarks.bench_compile [--quick] [--backend inductor|aot_eager_decomp_partition]
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

from benchmarks import machine
from ckpt_lab.lessons import compiled
from ckpt_lab.training.models import build_model, get_config

OUT = Path(__file__).parent / "results" / "compile.json"
BACKENDS = ("inductor", compiled.FALLBACK)
SWEEP = (0.3, 0.1)               # budgets below memory_budget's 0.5

# name: (checkpoint policy, impl, compiled, activation_memory_budget or None)
VARIANTS = {
    "plain_eager": ("none", None, False, None),
    "plain_compiled": ("none", None, True, None),
    "torch_checkpoint_compiled": ("every", "torch", True, None),
    "ckpt_lab_compiled": ("every", "hooks", True, None),
    "ckpt_lab_eager": ("every", "hooks", False, None),
    "memory_budget": ("none", None, True, 0.5),
    **{f"memory_budget_{b}": ("none", None, True, b) for b in SWEEP},
}


def _budget(value):
    if value is None:
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config
    return functorch_config.patch(activation_memory_budget=value)


def _loss(model, idx, tgt):
    """The model's loss; each compiled variant compiles its own copy (`compiled.own_code`):
    variants that trace the same code would share one graph, and with it one memory budget."""
    return model(idx, tgt)


def prepare(name: str, config, batch: int, device: str, backend: str):
    """Build and compile-wrap one variant: (forward, model) for `compiled.compare`."""
    policy, impl, compiled_, budget = VARIANTS[name]
    model = build_model(config, policy, impl).to(device)
    run = torch.compile(compiled.own_code(_loss), backend=backend) if compiled_ else _loss
    gen = torch.Generator().manual_seed(0)
    idx, tgt = (torch.randint(0, config.vocab_size, (batch, config.block_size), generator=gen)
                .to(device) for _ in range(2))

    def forward():
        with _budget(budget):          # read when the graph is partitioned (a recompile too)
            return run(model, idx, tgt)

    return forward, model


def measure_backend(backend: str, config, batch: int, device: str, repeats: int,
                    names=tuple(VARIANTS)) -> dict:
    """The variants ``names`` (plain_compiled among them) compiled with one backend: rows, and
    their ratios to plain_compiled and of ckpt_lab's checkpoint to PyTorch's."""
    from torch._dynamo import reset
    from torch._dynamo.utils import counters
    if "plain_compiled" not in names:
        raise ValueError("the variants must include 'plain_compiled', the ratios' baseline")
    reset()
    counters.clear()
    rows = compiled.compare({name: prepare(name, config, batch, device, backend)
                             for name in names}, device, repeats)
    reset()
    base = rows["plain_compiled"]
    out = {"variants": rows, "vs_plain_compiled": {
        name: {"time": r["median_step_seconds"] / base["median_step_seconds"],
               "peak": r["peak_bytes"] / base["peak_bytes"]} for name, r in rows.items()}}
    if {"ckpt_lab_compiled", "torch_checkpoint_compiled"} <= set(rows):
        ours, theirs = rows["ckpt_lab_compiled"], rows["torch_checkpoint_compiled"]
        out["ckpt_lab_vs_torch_checkpoint"] = {
            "time": ours["median_step_seconds"] / theirs["median_step_seconds"],
            "peak": ours["peak_bytes"] / theirs["peak_bytes"]}
    return out


def main(out_path: Path | None = None, quick: bool = False, backends=BACKENDS,
         variants=tuple(VARIANTS)) -> dict:
    """Measure ``variants`` on each of ``backends`` that runs here and write the JSON; returns
    it. ``quick``: fewer repeats (and GPT's tiny sizes on CUDA); the CPU sizes stay, as
    compiling, not the model's size, takes the time there."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset = "mlp-cpu" if device == "cpu" else ("gpt-tiny" if quick else "gpt-gpu")
    config = get_config(preset)
    batch = 8 if device == "cpu" else 16
    repeats = 3 if quick else 9
    usable, why = compiled.pick_backend(device)
    skipped = {}
    if "inductor" in backends and usable != "inductor":
        skipped["inductor"] = why
    measured = {b: measure_backend(b, config, batch, device, repeats, variants)
                for b in backends if b not in skipped}
    result = {
        "device": device, "torch": torch.__version__, "machine": machine.describe(),
        "notes": machine.notes(),
        "model": {"preset": preset, "batch": batch, **{k: getattr(config, k) for k in (
            "n_layer", "n_embd", "depth", "width", "block_size") if hasattr(config, k)}},
        "repeats": repeats, "backends": measured, "skipped": skipped,
    }
    path = Path(out_path) if out_path else OUT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    chosen = BACKENDS
    if "--backend" in sys.argv:
        chosen = (sys.argv[sys.argv.index("--backend") + 1],)
    res = main(quick="--quick" in sys.argv, backends=chosen)
    print(f"{res['model']['preset']} on {res['device']} ({res['machine']['cpu']})")
    for backend, why in res["skipped"].items():
        print(f"{backend}: skipped, {why}")
    for backend, block in res["backends"].items():
        print(f"== {backend}")
        for name, r in block["variants"].items():
            cache = f" ({r['inductor_cache']})" if r["inductor_cache"] else ""
            print(f"{name:28s} compile {r['compile_seconds']:6.2f} s{cache:7s} step "
                  f"{r['median_step_seconds'] * 1e3:8.2f} ms  peak {r['peak_bytes'] / 2**20:8.2f} "
                  f"MiB  graphs {r['graphs']}  breaks {r['graph_breaks']}")
