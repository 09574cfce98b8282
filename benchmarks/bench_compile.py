"""A compiled training step with checkpointing: ckpt_lab's, PyTorch's, and compile's own.

One small GPT from ``ckpt_lab.training.models``, every block checkpointed, under ``torch.compile``:

* ``plain_eager`` / ``plain_compiled``: no checkpoint, without and with compile;
* ``torch_checkpoint_compiled``: ``torch.utils.checkpoint(..., use_reentrant=False)`` per block
  (``impl="torch"``), which Dynamo traces as a higher-order op: compiled, recomputed by the
  partitioner;
* ``ckpt_lab_compiled``: ``ckpt_lab.checkpoint`` per block. It is excluded from Dynamo, so
  each call is a graph break: the blocks run eagerly, the code between them is compiled;
* ``ckpt_lab_eager``: the same without compile, to read what the breaks cost;
* ``memory_budget``: no checkpoint, compile's own recomputation asked to keep about half the
  activations (``torch._functorch.config.activation_memory_budget``).

For each, measured by ``ckpt_lab.lessons.compiled.compare`` (lesson 11 measures its compiled
steps with the same function): the first step's time (compiling included), the median step
time over paired repeats in a rotating order after warm-up steps (a graph break can recompile
once), the bytes a forward leaves for the backward and the peak of a step, from the
allocator's events (``ckpt_lab.measure.allocator.profiled_memory``: compiled code runs eagerly under
``track_memory``'s dispatch mode, so that tracker cannot measure it), and how many graphs and
graph breaks Dynamo made. On CPU the backend is ``aot_eager_decomp_partition`` (the same decompositions and
min-cut partitioner as inductor, run eagerly: inductor's C++ compile takes ~45 s a variant on
a laptop CPU); on CUDA inductor. Run: python -m benchmarks.bench_compile [--inductor]
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

from ckpt_lab.lessons import compiled
from ckpt_lab.training.models import build_model, get_config

OUT = Path(__file__).parent / "results" / "compile.json"

# name: (checkpoint policy, impl, compiled, activation_memory_budget or None)
VARIANTS = {
    "plain_eager": ("none", None, False, None),
    "plain_compiled": ("none", None, True, None),
    "torch_checkpoint_compiled": ("every", "torch", True, None),
    "ckpt_lab_compiled": ("every", "hooks", True, None),
    "ckpt_lab_eager": ("every", "hooks", False, None),
    "memory_budget": ("none", None, True, 0.5),
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


def main(out_path: Path | None = None, quick: bool = False, backend: str | None = None) -> dict:
    """Measure every variant and write the JSON; returns the result dict."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = backend or ("inductor" if device == "cuda" else "aot_eager_decomp_partition")
    preset = "gpt-tiny" if quick else ("gpt-gpu" if device == "cuda" else "gpt-cpu")
    config = get_config(preset)
    batch = 8 if device == "cpu" else 16
    repeats = 3 if quick else 9
    from torch._dynamo import reset
    from torch._dynamo.utils import counters
    reset()
    counters.clear()
    rows = compiled.compare({name: prepare(name, config, batch, device, backend)
                             for name in VARIANTS}, device, repeats)
    reset()
    base = rows["plain_compiled"]
    result = {
        "device": device, "torch": torch.__version__, "backend": backend,
        "model": {"preset": preset, "batch": batch, "n_layer": config.n_layer,
                  "n_embd": config.n_embd, "block_size": config.block_size},
        "repeats": repeats, "variants": rows,
        "vs_plain_compiled": {
            name: {"time": r["median_step_seconds"] / base["median_step_seconds"],
                   "peak": r["peak_bytes"] / base["peak_bytes"]} for name, r in rows.items()},
        "ckpt_lab_vs_torch_checkpoint": {
            "time": rows["ckpt_lab_compiled"]["median_step_seconds"]
            / rows["torch_checkpoint_compiled"]["median_step_seconds"],
            "peak": rows["ckpt_lab_compiled"]["peak_bytes"]
            / rows["torch_checkpoint_compiled"]["peak_bytes"]},
    }
    path = Path(out_path) if out_path else OUT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    res = main(backend="inductor" if "--inductor" in sys.argv else None,
               quick="--quick" in sys.argv)
    print(f"{res['model']['preset']} on {res['device']}, backend {res['backend']}")
    for name, r in res["variants"].items():
        print(f"{name:28s} first {r['first_step_seconds']:7.2f} s  step "
              f"{r['median_step_seconds'] * 1e3:8.2f} ms  peak {r['peak_bytes'] / 2**20:8.2f} MiB"
              f"  graphs {r['graphs']}  breaks {r['graph_breaks']}")
