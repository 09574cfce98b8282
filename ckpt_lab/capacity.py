"""Capacity planning: which checkpointing strategy lets a transformer train on a given device.

Pure arithmetic on `formulas`: model state (params, grads, master copy, optimizer states) plus
the activation peak of each strategy, at the micro-batch given and at smaller micro-batches
reached by gradient accumulation (same effective batch, same FLOPs, less memory). The cheapest
strategy is the one with the least recomputation whose total stays under `headroom` of the
device (0.85 by default, the source article's rule: leave room for fragmentation, the CUDA
context and temporaries that no formula here counts).

Activations per layer follow Megatron-LM (`formulas.megatron_layer_terms`) in the activation
dtype of the precision (2 bytes mixed, 4 bytes fp32) with 1-byte dropout masks. Outside the
layers: the embedding dropout mask (sbh bytes), the inputs of the final LayerNorm and of the
output projection (2 x d sbh) and the fp32 logits the cross-entropy works on (4 sbV).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from . import formulas as F

DEFAULT_HEADROOM = 0.85


@dataclass(frozen=True)
class TransformerConfig:
    """A GPT-style model and its micro-batch."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 50257
    micro_batch: int = 1
    precision: str = "mixed"
    optimizer: str = "adam"

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        F.model_state_per_param(self.precision, self.optimizer)  # validates both names

    @property
    def num_params(self) -> int:
        """12 L h^2 (attention + 4h MLP) + 13 L h (biases, LayerNorms) + embeddings + final LN."""
        L, h = self.layers, self.hidden
        return 12 * L * h * h + 13 * L * h + self.vocab * h + self.seq * h + 2 * h

    @property
    def act_dtype_bytes(self) -> int:
        """Bytes per activation element: 4 in fp32, 2 in any mixed precision."""
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class StrategyRow:
    """One strategy at one micro-batch: its memory, its recompute and whether it fits."""

    strategy: str
    accumulation_steps: int
    micro_batch: int
    activation_bytes: int
    model_state_bytes: int
    recompute_overhead: float  # extra FLOPs / FLOPs of a step without recompute
    fits: bool

    @property
    def total_bytes(self) -> int:
        """Model state plus activation peak."""
        return self.activation_bytes + self.model_state_bytes


def parse_bytes(text) -> int:
    """'80GB' (10^9), '80GiB' (2^30), '512MiB', or a plain number of bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"memory size must be positive, got {text}")
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]i?[bB]|[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read a memory size from {text!r}; write e.g. 80GB or 24GiB")
    value, unit = float(m.group(1)), (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    if value <= 0:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return int(value * scale)


def _layer_and_extra(cfg: TransformerConfig, micro: int) -> tuple[int, int, int, int]:
    d = cfg.act_dtype_bytes
    terms = F.megatron_layer_terms(cfg.seq, micro, cfg.hidden, cfg.heads, act_bytes=d)
    layer = sum(terms.values())
    selective = layer - sum(terms[k] for k in F.ATTENTION_CORE_TERMS)
    sbh = cfg.seq * micro * cfg.hidden
    boundary = d * sbh
    extra = sbh + 2 * d * sbh + 4 * cfg.seq * micro * cfg.vocab
    return layer, selective, boundary, extra


def strategy_rows(cfg: TransformerConfig, device_bytes: int,
                  headroom: float = DEFAULT_HEADROOM) -> list[StrategyRow]:
    """Every strategy at the given micro-batch and at halvings reached by accumulation."""
    if isinstance(device_bytes, bool) or not isinstance(device_bytes, int) or device_bytes <= 0:
        raise ValueError(f"device_bytes must be a positive int, got {device_bytes!r}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    L = cfg.layers
    state = F.model_state_bytes(cfg.num_params, cfg.precision, cfg.optimizer)
    ks = [k for k in (2, 4, 8) if k < L]
    rows = []
    steps = 1
    while cfg.micro_batch % steps == 0:
        micro = cfg.micro_batch // steps
        layer, selective, boundary, extra = _layer_and_extra(cfg, micro)
        base = F.transformer_flops(L, cfg.hidden, cfg.seq, micro, cfg.vocab)
        fwd_layer = 24 * micro * cfg.seq * cfg.hidden ** 2 + 4 * micro * cfg.seq ** 2 * cfg.hidden
        candidates = [("none", L * layer, 0.0),
                      ("selective", L * selective,
                       F.transformer_flops(L, cfg.hidden, cfg.seq, micro, cfg.vocab,
                                           "selective") / base - 1)]
        for k in [1] + ks:
            starts = list(range(0, L, k))
            peak = F.segmented_peak_bytes(starts, [layer] * L, [boundary] * L, boundary)
            name = "every block" if k == 1 else f"every {k} blocks"
            candidates.append((name, peak, starts[-1] * fwd_layer / base))
        bis = F.bisection_cost(L, layer, boundary)
        candidates.append(("recursive", bis.peak_bytes, bis.recompute_layers * fwd_layer / base))
        for name, act, overhead in candidates:
            total = act + extra + state
            rows.append(StrategyRow(name, steps, micro, act + extra, state, overhead,
                                    total <= headroom * device_bytes))
        steps *= 2
    return rows


def cheapest(rows) -> StrategyRow | None:
    """The fitting row with the least recompute, then the fewest accumulation steps."""
    fitting = [r for r in rows if r.fits]
    return min(fitting, key=lambda r: (r.recompute_overhead, r.accumulation_steps),
               default=None)


def plan_table(cfg: TransformerConfig, device_bytes: int,
               headroom: float = DEFAULT_HEADROOM) -> str:
    """The strategy table as text (GiB), with the cheapest fitting strategy or why none fits."""
    rows = strategy_rows(cfg, device_bytes, headroom)
    gib = 2 ** 30
    lines = [f"{cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, seq {cfg.seq}, "
             f"vocab {cfg.vocab}: {cfg.num_params / 1e9:.2f}B parameters, "
             f"{cfg.precision} + {cfg.optimizer}",
             f"device {device_bytes / gib:.1f} GiB, budget {headroom:.0%} = "
             f"{headroom * device_bytes / gib:.1f} GiB",
             f"{'strategy':<16}{'accum':>6}{'micro':>6}{'activations':>13}{'state':>10}"
             f"{'total':>10}{'recompute':>11}  fits"]
    for r in rows:
        lines.append(f"{r.strategy:<16}{r.accumulation_steps:>6}{r.micro_batch:>6}"
                     f"{r.activation_bytes / gib:>12.2f}G{r.model_state_bytes / gib:>9.2f}G"
                     f"{r.total_bytes / gib:>9.2f}G{r.recompute_overhead:>10.1%}  "
                     f"{'yes' if r.fits else 'no'}")
    best = cheapest(rows)
    if best is None:
        state = rows[0].model_state_bytes
        why = ("the model state alone exceeds the budget; shard it (ZeRO/FSDP) or use a larger "
               "device" if state > headroom * device_bytes else
               "even the leanest strategy at micro-batch 1 is too large; shorten the sequence")
        lines.append(f"nothing fits: {why}.")
    else:
        lines.append(f"cheapest that fits: {best.strategy}, {best.accumulation_steps} "
                     f"accumulation step(s) of micro-batch {best.micro_batch}, "
                     f"{best.total_bytes / gib:.2f} GiB, +{best.recompute_overhead:.1%} FLOPs")
    return "\n".join(lines)
