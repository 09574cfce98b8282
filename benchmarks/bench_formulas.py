"""Predicted against measured peak activation bytes, over a sweep of models and sizes.

"Peak activation bytes" here: the highest `track_memory` reading during one forward, the
cross-entropy loss and the backward of a model whose parameters, parameter gradients
(pre-allocated, so backward accumulates into them in place) and input ids all exist before the
block. So it counts what the step itself allocates: saved activations, logits, and the
gradients in flight; not the model state (see `formulas.model_state_bytes` for that).
bf16 means the whole model cast with `.to(torch.bfloat16)`, as Megatron's 16-bit formula
assumes; autocast would instead keep fp32 inputs of some ops and cache bf16 weight copies.
The predictions come from `formulas.chain_peak_bytes` fed by `formulas.gpt_layers` /
`formulas.mlp_layers`; segments are checkpoint_sequential-style plans over `model.layers()`.
Run: python -m benchmarks.bench_formulas
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from ckpt_lab import formulas, track_memory
from ckpt_lab.training.models import GPTConfig, MLPConfig, build_model
from ckpt_lab.plan.planner import uniform_plan

OUT = Path(__file__).parent / "results" / "formulas.json"
VOCAB = 256
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def measure_peak_bytes(model, batch: int, seq: int, dtype: torch.dtype) -> int:
    """Peak bytes of forward + loss + backward, model state and inputs excluded (see above)."""
    model = model.to(dtype).train()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (batch, seq), generator=g)
    targets = torch.randint(0, VOCAB, (batch, seq), generator=g)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        model(idx, targets).backward()
    return mem.peak_bytes


def predict_peak_bytes(kind: str, cfg, batch: int, segments, dtype_bytes: int) -> int:
    """The formula's peak for the same run."""
    if kind == "gpt":
        layers = formulas.gpt_layers(batch, cfg.block_size, cfg.n_layer, cfg.n_embd,
                                     cfg.n_head, cfg.vocab_size, dtype_bytes, cfg.dropout > 0)
    else:
        layers = formulas.mlp_layers(batch, cfg.block_size, cfg.depth, cfg.width,
                                     cfg.vocab_size, dtype_bytes)
    return formulas.chain_peak_bytes(layers, segments, batch * cfg.block_size,
                                     cfg.vocab_size, dtype_bytes)


def cases(quick: bool):
    """(kind, config, batch, segment count) of the sweep; segments = 1 means no checkpoint."""
    if quick:
        grid = [(2, 4, 16, 1), (5, 2, 32, 3), (3, 8, 16, 2)]
    else:
        grid = itertools.product([2, 4, 8], [2, 8], [16, 32, 64], [1, 2, 3, 4])
    for layers, batch, seq, s in grid:
        yield "mlp", MLPConfig(block_size=seq, width=64, depth=layers), batch, s
        yield "gpt", GPTConfig(block_size=seq, n_layer=layers, n_head=2, n_embd=64,
                               dropout=0.1), batch, s


def sweep(quick: bool = False) -> list[dict]:
    """Every case in fp32 and bf16: predicted, measured and their ratio."""
    rows = []
    for kind, cfg, batch, s in cases(quick):
        for dname, dtype in DTYPES.items():
            model = build_model(cfg)
            starts = uniform_plan(len(model.layers()), s)
            model.set_policy(starts)
            predicted = predict_peak_bytes(kind, cfg, batch, model.segments(),
                                           torch.empty(0, dtype=dtype).element_size())
            measured = measure_peak_bytes(model, batch, cfg.block_size, dtype)
            rows.append(dict(model=kind, dtype=dname, layers=len(model.blocks()), batch=batch,
                             seq=cfg.block_size, segments=s, boundaries=starts,
                             predicted_bytes=predicted, measured_bytes=measured,
                             ratio=predicted / measured))
    return rows


def main(out_path=None, quick: bool = False) -> dict:
    """Run the sweep and write it as JSON; returns what it wrote."""
    torch.manual_seed(0)
    rows = sweep(quick)
    ratios = [r["ratio"] for r in rows]
    result = {"definition": __doc__.split("\n\n")[1], "goal": [0.95, 1.05],
              "min_ratio": min(ratios), "max_ratio": max(ratios), "cases": rows}
    path = Path(out_path) if out_path is not None else OUT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    r = main()
    print(f"{len(r['cases'])} cases, predicted / measured in "
          f"[{r['min_ratio']:.4f}, {r['max_ratio']:.4f}] -> {OUT}")
