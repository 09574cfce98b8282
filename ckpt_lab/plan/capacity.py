"""Capacity planning: which checkpointing strategy lets a transformer train on a given device.

Pure arithmetic on `formulas`: model state (params, grads, master copy, optimizer states) plus
the activation peak of each strategy, at the micro-batch given and at smaller micro-batches
reached by gradient accumulation (same effective batch, same FLOPs, less memory). The cheapest
strategy is the one with the least recomputation whose total stays under `headroom` of the
device (0.85 by default, the source article's rule: leave room for fragmentation, the CUDA
context and temporaries that no formula here counts).

Activations per layer follow Megatron-LM (Korthikanti et al. 2022) through
`formulas.transformer_layer_terms`, in the activation dtype of the precision (2 bytes mixed,
4 bytes fp32) with 1-byte dropout masks. A config describes either a GPT-2-style model (4h GeLU
MLP, attention written out, dropout: the defaults) or a current one: fused attention
(``attention="sdpa"``, no s^2 term), grouped-query attention (``kv_heads``) and a SwiGLU MLP
(``mlp="swiglu"``, three matrices of width ``intermediate``), with Llama's bookkeeping
(``style="llama"``: no biases, RMSNorm, rotary positions, untied output). Outside the layers:
the embedding dropout mask (sbh bytes, with dropout), the inputs of the final norm and of the
output projection (2 x d sbh) and the fp32 logits the cross-entropy works on (4 sbV).

Fine-tuning (``lora_rank``): the base is frozen, stored in ``base_bits`` (16, or 8 and 4 as
bitsandbytes quantises it), and only LoRA adapters on every linear layer of the blocks train,
in fp32, with their gradients and optimizer state (`formulas.lora_state_bytes`); each adapter
keeps its r-wide output and its own copy of its input for backward
(`formulas.lora_layer_extra_bytes`), and a quantised base adds one dequantised weight at a time
to the step (`formulas.dequantized_copy_bytes`). A ``paged_`` optimizer's state may move
to the host while activations peak (bitsandbytes' paged optimizers, QLoRA sec. 3), so it
counts only against the model state, not on top of the activations.

`ARCHITECTURES` names published models; `TransformerConfig.named("llama2-70b", seq=4096)`
builds one, and its `num_params` equals the parameter count of the released checkpoint
(tests/plan/test_capacity.py asserts it).
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, replace

from . import formulas as F

DEFAULT_HEADROOM = 0.85


MAX_LAYERS = 10_000        # far deeper than any published transformer; the work grows with it


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer and its micro-batch; the defaults describe a GPT-2-style one.

    kv_heads: K/V heads (None: as many as query heads); mlp: "gelu" or "swiglu";
    intermediate: MLP width (None: 4h for GeLU, Llama's about 8h/3 for SwiGLU); attention:
    "eager" (scores stored) or "sdpa" (fused, FlashAttention-like); style: "gpt" or "llama"
    (biases, norms, positions, tying; see `formulas.transformer_params`); dropout: None means
    on for "gpt", off for "llama".
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 50257
    micro_batch: int = 1
    precision: str = "mixed"
    optimizer: str = "adam"
    kv_heads: int | None = None
    mlp: str = "gelu"
    intermediate: int | None = None
    attention: str = "eager"
    style: str = "gpt"
    dropout: bool | None = None
    lora_rank: int | None = None
    base_bits: int = 16

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.layers > MAX_LAYERS:
            raise ValueError(f"layers must be at most {MAX_LAYERS:,}, got {self.layers:,}: the "
                             "table plans every segment length and the recursion over the "
                             "layers, work that grows with their number (the deepest published "
                             "transformers have a few hundred)")
        if self.style not in F.STYLES:
            raise ValueError(f"style must be one of {F.STYLES}, got {self.style!r}")
        kv, inter = F.arch_options(self.hidden, self.heads, self.kv_heads, self.mlp,
                                  self.intermediate, self.attention)
        object.__setattr__(self, "kv_heads", kv)
        object.__setattr__(self, "intermediate", inter)
        if self.dropout is None:
            object.__setattr__(self, "dropout", self.style == "gpt")
        elif not isinstance(self.dropout, bool):
            raise ValueError(f"dropout must be True, False or None, got {self.dropout!r}")
        F.model_state_per_param(self.precision, self.optimizer)  # validates both names
        if self.base_bits not in F.BASE_BITS:
            raise ValueError(f"base_bits must be one of {F.BASE_BITS}, got {self.base_bits!r}")
        if self.lora_rank is None:
            if self.base_bits != 16:
                raise ValueError(f"a {self.base_bits}-bit base is frozen and cannot train by "
                                 "itself: give a LoRA rank too (QLoRA: base_bits=4, lora_rank=16)")
            return
        smallest = min(min(shape) for shape in self.linear_shapes().values())
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, numbers.Integral) \
                or not 1 <= self.lora_rank <= smallest:
            raise ValueError(f"lora_rank must be an int from 1 to {smallest} (the smallest side "
                             f"of a layer's weights), got {self.lora_rank!r}; 8 to 64 is usual")
        if self.precision not in ("mixed", "fp32"):
            raise ValueError("with LoRA, precision must be 'mixed' (a 16-bit base) or 'fp32'; "
                             f"got {self.precision!r}")
        if self.precision == "fp32" and self.base_bits != 16:
            raise ValueError("a quantised base computes in 16 bits: use precision='mixed'")

    @classmethod
    def named(cls, name: str, **overrides) -> "TransformerConfig":
        """A published architecture from `ARCHITECTURES`, e.g. named("llama2-7b", micro_batch=8)."""
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {name!r}; known: {sorted(ARCHITECTURES)}")
        return cls(**{**ARCHITECTURES[name].fields, **overrides})

    @property
    def num_params(self) -> int:
        """Parameters, counted by `formulas.transformer_params` for this style."""
        return F.transformer_params(self.layers, self.hidden, self.heads, self.vocab, self.seq,
                                    self.kv_heads, self.mlp, self.intermediate, self.style)

    def linear_shapes(self) -> dict:
        """(d_out, d_in) of one block's weight matrices, the ones LoRA adapts."""
        return F.transformer_linear_shapes(self.hidden, self.heads, self.kv_heads, self.mlp,
                                           self.intermediate)

    def finetune_state(self) -> F.FinetuneStateBytes:
        """Model state with LoRA: the frozen base, the adapters, their gradients and state."""
        if self.lora_rank is None:
            raise ValueError("finetune_state needs a lora_rank; full training's state is "
                             "formulas.model_state_bytes")
        shapes = list(self.linear_shapes().values()) * self.layers
        other = self.num_params - sum(o * i for o, i in shapes)
        fp32 = self.precision == "fp32"   # an fp32 base: 4 bytes a weight
        return F.lora_state_bytes(shapes, other, self.lora_rank, 32 if fp32 else self.base_bits,
                                  self.optimizer, other_bytes=4 if fp32 else 2)

    @property
    def model_state_bytes(self) -> int:
        """Weights, gradients and optimizer state: full training's, or LoRA's."""
        if self.lora_rank is None:
            return F.model_state_bytes(self.num_params, self.precision, self.optimizer)
        return self.finetune_state().total

    @property
    def pageable_bytes(self) -> int:
        """Optimizer state a paged optimizer may move to the host while activations peak."""
        if not self.optimizer.startswith("paged_"):
            return 0
        if self.lora_rank is not None:
            return self.finetune_state().optimizer
        return round(self.num_params * F.optimizer_bytes_per_param(self.optimizer))

    def describe_training(self) -> str:
        """What trains, in what: e.g. "LoRA r=16 on a 4-bit base, adamw8bit"."""
        if self.lora_rank is None:
            return f"full training, {self.precision} + {self.optimizer}"
        return (f"LoRA r={self.lora_rank} on every block's linear layers, "
                f"{self.base_bits if self.precision == 'mixed' else 32}-bit frozen base, "
                f"{self.optimizer}")

    @property
    def act_dtype_bytes(self) -> int:
        """Bytes per activation element: 4 in fp32, 2 in any mixed precision."""
        return 4 if self.precision == "fp32" else 2

    def describe(self) -> str:
        """One line: the shape and the architecture options."""
        kv = f" ({self.kv_heads} kv)" if self.kv_heads != self.heads else ""
        return (f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads{kv}, "
                f"{self.mlp} MLP {self.intermediate}, {self.attention} attention, "
                f"{self.style} style{', dropout' if self.dropout else ''}, seq {self.seq}, "
                f"vocab {self.vocab}")


@dataclass(frozen=True)
class Architecture:
    """A published model: its config fields and the parameter count of its released weights."""

    fields: dict
    params: int
    source: str


_LLAMA = dict(mlp="swiglu", style="llama", attention="sdpa")
ARCHITECTURES = {
    # Radford et al. 2019; counts of the released GPT-2 checkpoints (124M and 1.5B "XL").
    "gpt2": Architecture(dict(layers=12, hidden=768, heads=12, seq=1024, vocab=50257),
                         124_439_808, "Radford et al. 2019, GPT-2 small"),
    "gpt2-xl": Architecture(dict(layers=48, hidden=1600, heads=25, seq=1024, vocab=50257),
                            1_557_611_200, "Radford et al. 2019, GPT-2 XL"),
    # Touvron et al. 2023, "Llama 2", Table 1 and sec. 2.2 (GQA with 8 kv heads for 70B);
    # shapes from the released params.json / model cards, counts of the released weights.
    "llama2-7b": Architecture(dict(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000,
                                   intermediate=11008, **_LLAMA), 6_738_415_616,
                              "Touvron et al. 2023, Llama 2 7B"),
    "llama2-13b": Architecture(dict(layers=40, hidden=5120, heads=40, seq=4096, vocab=32000,
                                    intermediate=13824, **_LLAMA), 13_015_864_320,
                               "Touvron et al. 2023, Llama 2 13B"),
    "llama2-70b": Architecture(dict(layers=80, hidden=8192, heads=64, kv_heads=8, seq=4096,
                                    vocab=32000, intermediate=28672, **_LLAMA),
                               68_976_648_192, "Touvron et al. 2023, Llama 2 70B"),
    # Meta Llama 3 model card (2024): 128,256-token vocabulary, GQA with 8 kv heads at both sizes.
    "llama3-8b": Architecture(dict(layers=32, hidden=4096, heads=32, kv_heads=8, seq=8192,
                                   vocab=128256, intermediate=14336, **_LLAMA), 8_030_261_248,
                              "Meta 2024, Llama 3 8B model card"),
    "llama3-70b": Architecture(dict(layers=80, hidden=8192, heads=64, kv_heads=8, seq=8192,
                                    vocab=128256, intermediate=28672, **_LLAMA),
                               70_553_706_496, "Meta 2024, Llama 3 70B model card"),
}


@dataclass(frozen=True)
class StrategyRow:
    """One strategy at one micro-batch: its memory, its recompute and whether it fits.

    strategy: "none", "selective", "segments of k blocks" (one checkpoint per run of k
    consecutive blocks, the models' ``policy="every:k"``; "segments of 1 block" is full
    recomputation) or "recursive" (bisection, lesson 6).
    """

    strategy: str
    accumulation_steps: int
    micro_batch: int
    activation_bytes: int
    model_state_bytes: int
    recompute_overhead: float  # extra FLOPs / FLOPs of a step without recompute
    fits: bool
    pageable_bytes: int = 0    # a paged optimizer's state, on the host while activations peak

    @property
    def total_bytes(self) -> int:
        """Total peak (model state included): the state plus the step peak (activations),
        less what a paged optimizer moves to the host meanwhile (then the state alone, at
        the optimizer's step, is the floor)."""
        return max(self.activation_bytes + self.model_state_bytes - self.pageable_bytes,
                   self.model_state_bytes)


def parse_bytes(text) -> int:
    """'80GB' (10^9), '80GiB' (2^30), '512MiB', or a plain number of bytes."""
    if isinstance(text, numbers.Real) and not isinstance(text, bool):
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
    terms = F.transformer_layer_terms(cfg.seq, micro, cfg.hidden, cfg.heads, cfg.kv_heads,
                                      cfg.mlp, cfg.intermediate, cfg.attention, cfg.dropout,
                                      act_bytes=d)
    layer = sum(terms.values())
    selective = layer - sum(terms[k] for k in F.attention_core_terms(cfg.attention)
                            if k in terms)
    sbh = cfg.seq * micro * cfg.hidden
    boundary = d * sbh
    extra = (sbh if cfg.dropout else 0) + 2 * d * sbh + 4 * cfg.seq * micro * cfg.vocab
    if cfg.lora_rank is not None:   # adapters' outputs, input copies and 16-bit weights
        shapes = cfg.linear_shapes()
        lora = F.lora_layer_extra_bytes(cfg.seq * micro, shapes, cfg.lora_rank, d)
        layer, selective = layer + lora, selective + lora
        extra += F.dequantized_copy_bytes(shapes.values(), cfg.base_bits, d)
    return layer, selective, boundary, extra


def step_flops(cfg: TransformerConfig, micro: int, recompute: str = "none") -> int:
    """FLOPs of one micro-batch step: 3x the forward (2 per weight per token, 4bs^2h per layer
    for the attention core, 2bshV for the logits); "selective" adds the cores once more.

    For the GPT defaults this is `formulas.transformer_flops` (Narayanan et al. 2021).
    """
    if recompute not in ("none", "selective"):
        raise ValueError(f"recompute must be 'none' or 'selective', got {recompute!r}")
    weights = F.transformer_layer_weights(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.mlp,
                                          cfg.intermediate)
    core = 4 * micro * cfg.seq ** 2 * cfg.hidden
    layer = 2 * micro * cfg.seq * weights + core
    step = 3 * (cfg.layers * layer + 2 * micro * cfg.seq * cfg.hidden * cfg.vocab)
    return step + (cfg.layers * core if recompute == "selective" else 0)


def strategy_rows(cfg: TransformerConfig, device_bytes: int,
                  headroom: float = DEFAULT_HEADROOM) -> list[StrategyRow]:
    """Every strategy at the given micro-batch and at halvings reached by accumulation."""
    if isinstance(device_bytes, bool) or not isinstance(device_bytes, numbers.Integral) \
            or device_bytes <= 0:
        raise ValueError(f"device_bytes must be a positive int, got {device_bytes!r}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    L = cfg.layers
    state, pageable = cfg.model_state_bytes, cfg.pageable_bytes
    ks = [k for k in (2, 4, 8) if k < L]
    rows = []
    steps = 1
    while cfg.micro_batch % steps == 0:
        micro = cfg.micro_batch // steps
        layer, selective, boundary, extra = _layer_and_extra(cfg, micro)
        base = step_flops(cfg, micro)
        fwd_layer = (2 * micro * cfg.seq * F.transformer_layer_weights(
            cfg.hidden, cfg.heads, cfg.kv_heads, cfg.mlp, cfg.intermediate)
            + 4 * micro * cfg.seq ** 2 * cfg.hidden)
        candidates = [("none", L * layer, 0.0),
                      ("selective", L * selective, step_flops(cfg, micro, "selective") / base - 1)]
        for k in [1] + ks:
            starts = list(range(0, L, k))
            peak = F.segmented_peak_bytes(starts, [layer] * L, [boundary] * L, boundary)
            name = "segments of 1 block" if k == 1 else f"segments of {k} blocks"
            candidates.append((name, peak, starts[-1] * fwd_layer / base))
        bis = F.bisection_cost(L, layer, boundary)
        candidates.append(("recursive", bis.peak_bytes, bis.recompute_layers * fwd_layer / base))
        for name, act, overhead in candidates:
            row = StrategyRow(name, steps, micro, act + extra, state, overhead, False, pageable)
            rows.append(replace(row, fits=row.total_bytes <= headroom * device_bytes))
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
    lines = [f"{cfg.describe()}: {cfg.num_params / 1e9:.2f}B parameters, "
             f"{cfg.describe_training()}",
             f"device {device_bytes / 1e9:.1f} GB = {device_bytes / gib:.1f} GiB, budget "
             f"{headroom:.0%} = {headroom * device_bytes / gib:.1f} GiB; activations: step peak "
             "(activations); total: total peak (model state included); recompute: extra FLOPs "
             "as a share of a step's (forward + backward)",
             f"{'strategy':<22}{'accum':>6}{'micro':>6}{'activations':>13}{'state':>10}"
             f"{'total':>10}{'recompute':>11}  fits"]
    for r in rows:
        lines.append(f"{r.strategy:<22}{r.accumulation_steps:>6}{r.micro_batch:>6}"
                     f"{r.activation_bytes / gib:>12.2f}G{r.model_state_bytes / gib:>9.2f}G"
                     f"{r.total_bytes / gib:>9.2f}G{r.recompute_overhead:>10.1%}  "
                     f"{'yes' if r.fits else 'no'}")
    best = cheapest(rows)
    if best is None:
        state = rows[0].model_state_bytes
        smaller = ("fine-tune with LoRA (--lora-rank 16), on a 4-bit base (--base-bits 4), "
                   "or " if cfg.lora_rank is None else "quantise the base (--base-bits 4), ")
        why = ("the model state alone exceeds the budget; " + smaller + "shard it (ZeRO/FSDP), "
               "or use a larger device" if state > headroom * device_bytes else
               "even the leanest strategy at micro-batch 1 is too large; shorten the sequence")
        lines.append(f"nothing fits: {why}.")
    else:
        lines.append(f"cheapest that fits: {best.strategy}, {best.accumulation_steps} "
                     f"accumulation step(s) of micro-batch {best.micro_batch}, "
                     f"{best.total_bytes / gib:.2f} GiB, +{best.recompute_overhead:.1%} of a "
                     "step's FLOPs")
    return "\n".join(lines)
