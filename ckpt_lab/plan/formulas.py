"""Memory and compute of training, predicted with plain arithmetic (no tensors).

Everything here is a function of sizes and dtypes, so it can price a 70B model on a laptop.
`ckpt_lab.measure.memory` measures the same quantities; the tests hold the two to each other.

Sections: model state (params, grads, optimizer) per parameter; fine-tuning's model state
(LoRA adapters, 4- and 8-bit bases, 8-bit Adam); activations of a transformer layer after
Megatron-LM; the peak of a segmented chain; recursive bisection; FLOPs. (The two source
articles' formulas, as they stand and corrected, are lesson 9's: ckpt_lab.lessons.audit.)
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import lru_cache

DTYPE_BYTES = {"fp32": 4, "float32": 4, "tf32": 4, "fp16": 2, "float16": 2, "bf16": 2,
               "bfloat16": 2, "fp8": 1, "int8": 1}
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adamw8bit", "paged_adamw", "paged_adamw8bit")
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}   # fp32 states per parameter
# bitsandbytes' 8-bit Adam (Dettmers et al. 2022): two 1-byte states, each with one fp32 absmax
# per block of 256 values; a tensor under 4096 values keeps its two states in fp32.
EIGHT_BIT_BLOCK = 256
EIGHT_BIT_MIN_NUMEL = 4096
EIGHT_BIT_ADAM_BYTES = 2 * (1 + 4 / EIGHT_BIT_BLOCK)


def dtype_bytes(dtype) -> int:
    """Bytes per element of a dtype given as a name ("bf16") or a torch.dtype."""
    name = str(dtype).replace("torch.", "").lower()
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def _check_int(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------- model state
@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per parameter of everything training keeps besides activations."""

    params: int
    grads: int
    master: int
    optimizer: float   # 8-bit Adam: 2 bytes plus its block constants

    @property
    def total(self) -> float:
        """Bytes per parameter, all parts together."""
        return self.params + self.grads + self.master + self.optimizer


PRECISIONS = {
    # name: (param dtype, grad dtype, fp32 master copy?, fp32 copy of the grads?)
    "fp32": ("fp32", "fp32", False, False),
    "mixed": ("bf16", "bf16", True, False),
    "mixed-fp32-grads": ("bf16", "fp32", True, False),
    "fp16-megatron": ("fp16", "fp16", True, True),
}


def model_state_per_param(precision: str = "mixed", optimizer: str = "adam") -> ModelStateBytes:
    """Bytes per parameter of params, grads, fp32 master copy and optimizer states.

    ========================  ======  =====  ======  ====  =========  =========  ==========
    precision                  param   grad   master  SGD   +momentum  Adam(W)    source
    ========================  ======  =====  ======  ====  =========  =========  ==========
    fp32                       4       4      0       8     12         16         -
    mixed (16-bit p and g)     2       2      4       8     12         **16**     ZeRO, K=12
    mixed-fp32-grads           2       4      4       10    14         **18**     Megatron
    fp16-megatron (+main g)    2       2+4    4       12    16         **20**     Megatron
    ========================  ======  =====  ======  ====  =========  =========  ==========

    ZeRO (Rajbhandari et al., 2020, sec. 3.1) writes mixed-precision Adam as 2 + 2 + K bytes
    per parameter with K = 12: the fp32 master weights (4), momentum (4) and variance (4) that
    the optimizer updates, so 16 bytes. The 18 quoted elsewhere (Megatron-LM's distributed
    optimizer table) keeps gradients in fp32 (4 instead of 2), because accumulating many
    micro-batches or all-reducing in 16 bits loses precision. Megatron's fp16 path keeps
    fp16 grads *and* an fp32 "main grad" copy: 2 + 2 + 4 + 12 = 20. Pure fp32 Adam needs no
    master copy: 4 + 4 + 8 = 16 as well, which is why mixed precision saves activation memory
    and time but not model-state memory. 8-bit Adam ("adamw8bit") keeps its two states in 2
    bytes plus block constants (`optimizer_bytes_per_param`); a "paged_" optimizer keeps the
    same bytes, in memory the driver may move to the host (`capacity` prices that).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    p_dtype, g_dtype, master, main_grad = PRECISIONS[precision]
    states = optimizer_bytes_per_param(optimizer)
    grads = dtype_bytes(g_dtype) + (4 if main_grad else 0)
    return ModelStateBytes(dtype_bytes(p_dtype), grads, 4 if master else 0, states)


def model_state_bytes(num_params: int, precision: str = "mixed", optimizer: str = "adam") -> int:
    """Bytes of params + grads + master copy + optimizer states for `num_params` parameters."""
    _check_int("num_params", num_params)
    return round(num_params * model_state_per_param(precision, optimizer).total)


def model_state_table() -> list[dict]:
    """Every (precision, optimizer) pair with its bytes per parameter, for lessons."""
    rows = []
    for precision in PRECISIONS:
        for optimizer in ("sgd", "momentum", "adam"):
            m = model_state_per_param(precision, optimizer)
            rows.append(dict(precision=precision, optimizer=optimizer, params=m.params,
                             grads=m.grads, master=m.master, optimizer_states=m.optimizer,
                             total=m.total))
    return rows


# ------------------------------------------- fine-tuning: LoRA, quantised bases, 8-bit Adam
BASE_BITS = (16, 8, 4)   # bits a frozen base weight is stored in (32: an fp32 base)
NF4_BLOCK = 64            # QLoRA's NF4: one absmax per 64 weights...
NF4_DQ_BLOCK = 256        # ...itself quantised to 8 bits, one fp32 constant per 256 absmax
# Per quantised weight, tables bitsandbytes 0.50 keeps beside it: the NF4 code (16 fp32) and,
# double-quantised, the absmax code (256 fp32) and one fp32 offset.
NF4_TABLE_BYTES = 16 * 4
NF4_DQ_TABLE_BYTES = 256 * 4 + 4


def optimizer_bytes_per_param(optimizer: str = "adamw") -> float:
    """Bytes of optimizer state per parameter of a large tensor: 0, 4, 8, or 8-bit Adam's
    2 + 8/256 (two 1-byte states and one fp32 absmax per 256 values of each)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if optimizer.endswith("8bit"):
        return EIGHT_BIT_ADAM_BYTES
    return 4 * OPTIMIZER_STATES[optimizer.removeprefix("paged_")]


def optimizer_state_bytes(numels, optimizer: str = "adamw", step_bytes: int = 4) -> int:
    """Optimizer state of trainable tensors of `numels` values each, tensor by tensor.

    torch's Adam(W) keeps two fp32 states and a 0-dim fp32 step count (`step_bytes`) per
    tensor. bitsandbytes' 8-bit AdamW (`bnb.optim.AdamW8bit`, Dettmers et al. 2022) keeps
    two uint8 states with one fp32 absmax per block of 256 values each, and a step count in
    Python; a tensor under 4096 values (its `min_8bit_size`) keeps fp32 states. Its two
    256-entry quantisation maps are shared by all tensors (2 KiB once, left out here).
    """
    bytes_per = optimizer_bytes_per_param(optimizer)   # validates the name
    total = 0
    for i, n in enumerate(numels):
        _check_int(f"numels[{i}]", n, 1)
        if not optimizer.endswith("8bit"):
            total += int(bytes_per) * n + (step_bytes if bytes_per else 0)
        elif n < EIGHT_BIT_MIN_NUMEL:
            total += 8 * n
        else:
            total += 2 * (n + 4 * -(-n // EIGHT_BIT_BLOCK))
    return total


def quantized_weight_bytes(d_out: int, d_in: int, bits: int = 4,
                           double_quant: bool = True) -> int:
    """Bytes of one frozen (d_out x d_in) weight stored in `bits`, as bitsandbytes stores it.

    * 16: bf16, 2 bytes a weight (32: fp32, 4).
    * 8 (LLM.int8, Dettmers et al. 2022): an int8 weight and one fp32 scale per output row.
    * 4 (NF4, Dettmers et al. 2023, QLoRA): two weights a byte and one absmax per 64 weights,
      fp32 (0.5 bits a weight) or, double-quantised, 8-bit with one fp32 constant per 256 of
      them: 8/64 + 32/(64 x 256) = 0.127 bits a weight, QLoRA's sec. 3 figure; plus the small
      code tables bitsandbytes keeps per weight (`NF4_TABLE_BYTES`, `NF4_DQ_TABLE_BYTES`).
    """
    _check_int("d_out", d_out, 1)
    _check_int("d_in", d_in, 1)
    if bits not in BASE_BITS + (32,):
        raise ValueError(f"bits must be one of {BASE_BITS}, got {bits!r}")
    n = d_out * d_in
    if bits >= 16:
        return bits // 8 * n
    if bits == 8:
        return n + 4 * d_out
    blocks = -(-n // NF4_BLOCK)
    packed = -(-n // 2) + NF4_TABLE_BYTES
    if not double_quant:
        return packed + 4 * blocks
    return packed + blocks + 4 * -(-blocks // NF4_DQ_BLOCK) + NF4_DQ_TABLE_BYTES


def lora_numels(shapes, rank: int) -> list[int]:
    """Sizes of the LoRA adapters of (d_out, d_in) weights: A is r x d_in, B is d_out x r.

    Hu et al. 2021: W x + B A x, with A and B trained and W frozen; r (d_in + d_out) values
    per adapted weight instead of d_out d_in.
    """
    _check_int("rank", rank, 1)
    out = []
    for d_out, d_in in shapes:
        _check_int("d_out", d_out, 1)
        _check_int("d_in", d_in, 1)
        out += [rank * d_in, d_out * rank]
    return out


def transformer_linear_shapes(hidden: int, heads: int, kv_heads: int | None = None,
                              mlp: str = "gelu", intermediate: int | None = None) -> dict:
    """(d_out, d_in) of one layer's weight matrices: q, k, v, o, then the MLP's (gate,) up,
    down; peft's ``target_modules="all-linear"`` adapts all of them (not the output head)."""
    kv, inter = arch_options(hidden, heads, kv_heads, mlp, intermediate)
    kv_dim = kv * (hidden // heads)
    shapes = {"q": (hidden, hidden), "k": (kv_dim, hidden), "v": (kv_dim, hidden),
              "o": (hidden, hidden)}
    if mlp == "swiglu":
        shapes["gate"] = (inter, hidden)
    shapes.update(up=(inter, hidden), down=(hidden, inter))
    return shapes


@dataclass(frozen=True)
class FinetuneStateBytes:
    """Model state of fine-tuning with adapters: what is frozen and what trains."""

    base: int              # the frozen weights, quantised or not
    adapters: int          # trainable adapter weights
    adapter_grads: int     # their gradients
    optimizer: int         # their optimizer state

    @property
    def total(self) -> int:
        """All four parts, in bytes."""
        return self.base + self.adapters + self.adapter_grads + self.optimizer


def lora_state_bytes(shapes, other_params: int, rank: int, base_bits: int = 16,
                     optimizer: str = "adamw", adapter_bytes: int = 4,
                     other_bytes: int = 2, double_quant: bool = True) -> FinetuneStateBytes:
    """Model state of LoRA (or, with a 4-bit base, QLoRA) fine-tuning.

    `shapes`: (d_out, d_in) of every frozen weight that gets an adapter, stored in `base_bits`
    (`quantized_weight_bytes`); `other_params`: the frozen parameters that get none
    (embeddings, norms, output head), `other_bytes` each (bitsandbytes quantises linear
    layers only, and transformers keeps the head unquantised). The adapters train in fp32
    (peft casts them so, whatever the base's dtype): weights and gradients 4 bytes a value,
    the optimizer's state per tensor (`optimizer_state_bytes`). No fp32 master copy: the
    trained values are fp32 already, and the frozen base has no gradient and no state.
    """
    _check_int("other_params", other_params)
    shapes = list(shapes)
    base = sum(quantized_weight_bytes(o, i, base_bits, double_quant) for o, i in shapes)
    numels = lora_numels(shapes, rank)
    adapters = adapter_bytes * sum(numels)
    return FinetuneStateBytes(base + other_bytes * other_params, adapters, adapters,
                              optimizer_state_bytes(numels, optimizer))


def lora_layer_extra_bytes(tokens: int, shapes: dict, rank: int, act_bytes: int = 2) -> int:
    """What LoRA (peft, under autocast) keeps per layer beyond full training's activations.

    Each adapter keeps its r-wide output A x for B's gradient, and autocast's 16-bit copy of
    its A and B. Each also keeps its own 16-bit copy of its input (peft casts the input to the
    adapter's fp32 and autocast casts it back: a new tensor per adapter), where full training
    keeps one input shared by q, k and v and one shared by gate and up: 2 (GeLU MLP) or 3
    (SwiGLU) inputs more. `shapes`: one layer's adapted weights (`transformer_linear_shapes`).
    """
    _check_int("tokens", tokens, 1)
    hidden = shapes["q"][1]
    copies = 3 if "gate" in shapes else 2
    adapters = sum(lora_numels(shapes.values(), rank))
    return act_bytes * tokens * (rank * len(shapes) + copies * hidden) + 2 * adapters


def dequantized_copy_bytes(shapes, base_bits: int = 4, compute_bytes: int = 2) -> int:
    """The most bytes of dequantised base weights a step holds at once: one weight's copy.

    bitsandbytes' 4-bit and 8-bit matmuls save the quantised weight for backward, not a
    dequantised copy; each forward and each backward dequantises the weight it needs into a
    temporary of the compute dtype and frees it when the matmul returns. So a step keeps no
    copy, and its peak gains at most the largest weight in the compute dtype (a 16-bit base
    needs none). tests/plan/test_finetune.py measures both on a tiny Llama.
    """
    if base_bits not in BASE_BITS + (32,):
        raise ValueError(f"base_bits must be one of {BASE_BITS}, got {base_bits!r}")
    if base_bits >= 16:
        return 0
    return compute_bytes * max((o * i for o, i in shapes), default=0)


# ------------------------------------------------------------- transformer layer (Megatron)
def megatron_layer_terms(seq: int, batch: int, hidden: int, heads: int,
                         act_bytes: int = 2, mask_bytes: int = 1) -> dict[str, int]:
    """Bytes one transformer layer saves for backward, term by term, after Megatron-LM.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    sec. 4.1) count, with s = seq, b = batch, h = hidden, a = heads, 16-bit activations and
    1-byte dropout masks: attention 11sbh + 5as^2b, MLP (4h wide) 19sbh, two LayerNorms 4sbh,
    so sbh(34 + 5as/h) per layer. Written here per element so other dtypes work:
    activation terms scale with `act_bytes`, masks with `mask_bytes`.
    """
    for name, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads)):
        _check_int(name, v, 1)
    sbh, as2b = seq * batch * hidden, heads * seq * seq * batch
    d, m = act_bytes, mask_bytes
    return {
        "layernorm 1 input": d * sbh,
        "QKV projection input": d * sbh,
        "Q and K (for QK^T)": 2 * d * sbh,
        "softmax output": d * as2b,
        "attention dropout mask": m * as2b,
        "attention dropout output (for x V)": d * as2b,
        "V (for x V)": d * sbh,
        "output projection input": d * sbh,
        "attention output dropout mask": m * sbh,
        "layernorm 2 input": d * sbh,
        "MLP up-projection input": d * sbh,
        "GeLU input (4H)": 4 * d * sbh,
        "MLP down-projection input (4H)": 4 * d * sbh,
        "MLP dropout mask": m * sbh,
    }


ATTENTION_CORE_TERMS = ("softmax output", "attention dropout mask",
                        "attention dropout output (for x V)")


def megatron_layer_bytes(seq: int, batch: int, hidden: int, heads: int,
                         selective: bool = False) -> int:
    """The reference sbh(34 + 5as/h) bytes per layer; `selective` drops the 5as/h part.

    Selective recomputation (Megatron) keeps everything but the attention core (softmax, its
    dropout mask and output), which it recomputes: 34 sbh bytes per layer remain.
    """
    terms = megatron_layer_terms(seq, batch, hidden, heads)
    if selective:
        return sum(v for k, v in terms.items() if k not in ATTENTION_CORE_TERMS)
    return sum(terms.values())


# --------------------------------------------- current architectures: GQA, SwiGLU, fused attention
ATTENTIONS = ("eager", "sdpa")
MLPS = ("gelu", "swiglu")
STYLES = ("gpt", "llama")
FUSED_CORE_TERMS = ("softmax logsumexp (fp32, fused kernel)",)


def swiglu_intermediate(hidden: int, multiplier: float = 1.0, multiple_of: int = 256) -> int:
    """Llama's SwiGLU width: int(2/3 of 4h), times `multiplier`, rounded up to `multiple_of`.

    Two thirds of 4h keeps a three-matrix MLP at the parameters of a two-matrix 4h one
    (Shazeer 2020). Llama 2 7B: 11008; 13B: 13824; 70B (multiplier 1.3, multiple_of 4096): 28672.
    """
    _check_int("hidden", hidden, 1)
    _check_int("multiple_of", multiple_of, 1)
    width = int(multiplier * int(2 * 4 * hidden / 3))
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def arch_options(hidden: int, heads: int, kv_heads, mlp: str, intermediate, attention=None):
    """Check the architecture options; returns (kv_heads, intermediate) with defaults filled in."""
    _check_int("hidden", hidden, 1)
    _check_int("heads", heads, 1)
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    kv = heads if kv_heads is None else _check_int("kv_heads", kv_heads, 1)
    if heads % kv:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv}): each K/V head "
                         "serves a whole group of query heads")
    if mlp not in MLPS:
        raise ValueError(f"mlp must be one of {MLPS}, got {mlp!r}")
    if attention is not None and attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if intermediate is None:
        intermediate = 4 * hidden if mlp == "gelu" else swiglu_intermediate(hidden)
    return kv, _check_int("intermediate", intermediate, 1)


def transformer_layer_terms(seq: int, batch: int, hidden: int, heads: int,
                            kv_heads: int | None = None, mlp: str = "gelu",
                            intermediate: int | None = None, attention: str = "eager",
                            dropout: bool = True, act_bytes: int = 2,
                            mask_bytes: int = 1) -> dict[str, int]:
    """Bytes one transformer layer saves for backward, with the choices current models make.

    The defaults give Megatron's sbh(34 + 5as/h) (`megatron_layer_terms`, same values). Options:

    * ``kv_heads`` (grouped-query attention, Ainslie et al. 2023): K and V get kv_heads heads.
      With ``attention="eager"`` they are repeated to all heads before the matmuls (Llama's
      ``repeat_kv``) and the repeated copies are what is saved, so GQA saves no activations
      there; a fused kernel takes the kv heads as they are and K, V shrink by kv_heads/heads
      (PyTorch: ``scaled_dot_product_attention(..., enable_gqa=True)``; both cases are
      measured on a tiny Llama in tests/plan/test_capacity.py).
    * ``attention="sdpa"`` (a fused kernel: FlashAttention, Dao et al. 2022, or PyTorch's
      ``scaled_dot_product_attention``): the s x s scores are never stored, so the a s^2 b
      terms go. The kernel keeps Q, K, V, its output O and one fp32 logsumexp per row (4 a s b
      bytes), from which backward rebuilds the scores. O comes back in the (b, s, a, d_head)
      memory layout of the projections, so reshaping it for the output projection is a view:
      O *is* that projection's input, one tensor. Selective recomputation of a fused core can
      therefore drop only the logsumexp. Dropout inside a fused kernel keeps a seed, not a mask.
    * ``mlp="swiglu"`` (Shazeer 2020; Llama): down(silu(gate(x)) * up(x)) keeps x, the gate
      output (SiLU's input), the SiLU output, the up output and their product (the
      down-projection's input): sbh + 4 s b I, I = ``intermediate`` (default about 8h/3). A
      GeLU MLP keeps sbh + 2 s b I with I = 4h by default.
    * ``dropout=False``: no masks (Llama and most current models train without dropout).

    The norms' per-token statistics (LayerNorm mean and rstd, RMSNorm rstd: s b numbers each,
    under 1/h of a term) are left out as Korthikanti et al. do; norms count as fused (they keep
    their input, the next matmul keeps their output), as in Megatron-LM and TransformerEngine.
    """
    for name, v in (("seq", seq), ("batch", batch)):
        _check_int(name, v, 1)
    kv, inter = arch_options(hidden, heads, kv_heads, mlp, intermediate, attention)
    d, m = act_bytes, mask_bytes
    sbh, as2b = seq * batch * hidden, heads * seq * seq * batch
    skv = seq * batch * kv * (hidden // heads)
    sbi = seq * batch * inter
    eager = attention == "eager"
    terms = {"layernorm 1 input": d * sbh, "QKV projection input": d * sbh,
             "Q and K (for QK^T)": d * (sbh + (sbh if eager else skv))}
    if eager:
        terms["softmax output"] = d * as2b
        if dropout:
            terms["attention dropout mask"] = m * as2b
            terms["attention dropout output (for x V)"] = d * as2b
        terms["V (for x V)"] = d * sbh
    else:
        terms["V (for x V)"] = d * skv
        terms[FUSED_CORE_TERMS[0]] = 4 * heads * seq * batch
    terms["output projection input"] = d * sbh   # with "sdpa": the kernel's output O itself
    if dropout:
        terms["attention output dropout mask"] = m * sbh
    terms["layernorm 2 input"] = d * sbh
    terms["MLP up-projection input"] = d * sbh
    if mlp == "gelu":
        terms["GeLU input (intermediate)"] = d * sbi
        terms["MLP down-projection input (intermediate)"] = d * sbi
    else:
        terms["gate output (SiLU input)"] = d * sbi
        terms["SiLU output"] = d * sbi
        terms["up output"] = d * sbi
        terms["MLP down-projection input (intermediate)"] = d * sbi
    if dropout:
        terms["MLP dropout mask"] = m * sbh
    return terms


def attention_core_terms(attention: str = "eager") -> tuple[str, ...]:
    """The terms selective recomputation drops: what the attention core alone keeps."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    return ATTENTION_CORE_TERMS if attention == "eager" else FUSED_CORE_TERMS


def transformer_layer_weights(hidden: int, heads: int, kv_heads: int | None = None,
                              mlp: str = "gelu", intermediate: int | None = None) -> int:
    """Weights of one layer's matrices (Q, K, V, output projection, MLP), biases excluded.

    Each costs 2 FLOPs per token forward: a GPT layer's 12h^2 weights give Narayanan et al.'s
    24 b s h^2. GQA shrinks K and V to h x (kv_heads d_head); SwiGLU has three h x I matrices.
    """
    kv, inter = arch_options(hidden, heads, kv_heads, mlp, intermediate)
    kv_dim = kv * (hidden // heads)
    return 2 * hidden * hidden + 2 * hidden * kv_dim + (2 if mlp == "gelu" else 3) * hidden * inter


def transformer_params(layers: int, hidden: int, heads: int, vocab: int, seq: int = 0,
                       kv_heads: int | None = None, mlp: str = "gelu",
                       intermediate: int | None = None, style: str = "gpt") -> int:
    """Parameters of a decoder-only transformer.

    ``style="gpt"`` (GPT-2, minGPT): biases everywhere, LayerNorms (2h each), learned position
    embeddings (seq x h), output projection tied to the token embedding: with the defaults
    12 L h^2 + 13 L h + V h + seq h + 2h. ``style="llama"`` (Touvron et al. 2023): no biases,
    RMSNorms (h each), rotary positions (no parameters), an untied output projection.
    """
    _check_int("layers", layers, 1)
    _check_int("vocab", vocab, 1)
    _check_int("seq", seq)
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    kv, inter = arch_options(hidden, heads, kv_heads, mlp, intermediate)
    weights = transformer_layer_weights(hidden, heads, kv, mlp, inter)
    if style == "gpt":
        biases = 2 * hidden + 2 * kv * (hidden // heads) + (inter if mlp == "gelu" else 2 * inter) \
            + hidden
        per_layer = weights + biases + 2 * 2 * hidden
        return layers * per_layer + vocab * hidden + seq * hidden + 2 * hidden
    return layers * (weights + 2 * hidden) + 2 * vocab * hidden + hidden


# ------------------------------------------------------------------------ segmented chains
def _check_sizes(name: str, values) -> list:
    values = list(values)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0 or v != v:
            raise ValueError(f"{name}[{i}] must be a number >= 0, got {v!r}")
    return values


def segmented_peak_bytes(boundaries, act_bytes, out_bytes, input_bytes: int = 0) -> int:
    """Peak bytes of a chain run in segments starting at `boundaries`, last one not checkpointed.

    Layer i saves `act_bytes[i]` for backward and outputs `out_bytes[i]`. Every segment but
    the last keeps only its input (`input_bytes` for the first, else the output of the layer
    before it) and is recomputed in backward, so while segment j's activations are alive the
    kept inputs of the segments before it are too: peak = max_j (kept_before_j + acts of j).
    This is the model the planner optimises; it ignores the short-lived gradient buffers.
    """
    act = _check_sizes("act_bytes", act_bytes)
    out = _check_sizes("out_bytes", out_bytes)
    if not act or len(act) != len(out):
        raise ValueError(f"act_bytes and out_bytes must be non-empty and equally long, got "
                         f"{len(act)} and {len(out)}")
    if input_bytes < 0:
        raise ValueError(f"input_bytes must be >= 0, got {input_bytes}")
    n = len(act)
    starts = [int(b) for b in boundaries]
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) \
            or starts[-1] >= n:
        raise ValueError(f"boundaries must start with 0 and be strictly increasing layer "
                         f"indices below {n}, got {list(boundaries)}")
    ends = starts[1:] + [n]
    kept, peak = 0, 0
    for a, b in zip(starts, ends):
        peak = max(peak, kept + sum(act[a:b]))
        kept += input_bytes if a == 0 else out[a - 1]
    return peak


def uniform_boundaries(num_layers: int, segments: int) -> list[int]:
    """Segment starts as checkpoint_sequential makes them: size n // segments, last takes the rest."""
    _check_int("num_layers", num_layers, 1)
    _check_int("segments", segments, 1)
    if segments > num_layers:
        raise ValueError(f"segments ({segments}) cannot exceed num_layers ({num_layers})")
    size = num_layers // segments
    return [i * size for i in range(segments)]


def uniform_peak_bytes(num_layers: int, segments: int, layer_bytes: int,
                       boundary_bytes: int) -> int:
    """Peak of `num_layers` identical layers in `segments` uniform segments (last not recomputed)."""
    starts = uniform_boundaries(num_layers, segments)
    return segmented_peak_bytes(starts, [layer_bytes] * num_layers,
                                [boundary_bytes] * num_layers, boundary_bytes)


def chain_step_peak_bytes(num_layers: int, segments: int, unit_bytes: int,
                          weight_grad_bytes: int = 0) -> int:
    """Predicted peak of one step of a chain of Linear -> ReLU blocks under checkpoint_sequential.

    Each block keeps one output of ``unit_bytes`` and a kept input is as large, so the
    activations follow `uniform_peak_bytes`. The peak comes in backward: a block's gradient
    w.r.t. its input (one unit) is produced while the gradient arriving at it is still alive,
    and its own output, already used, is freed: one unit more, net. Add the block's weight
    gradient (``weight_grad_bytes``), computed into a fresh tensor and then added to ``.grad``.
    (Parameter gradients themselves are model state: the lessons allocate them before
    measuring.)
    """
    return (uniform_peak_bytes(num_layers, segments, unit_bytes, unit_bytes) + unit_bytes
            + weight_grad_bytes)


def optimal_segment_count(num_layers: int, layer_bytes: int, boundary_bytes: int) -> int:
    """The segment count with the least uniform peak (ties: fewer segments, less recompute).

    Why about sqrt(L): with S segments of L/S layers each of `a` bytes and S - 1 kept inputs
    of `b` bytes, peak(S) ~ (S - 1) b + (L / S) a. Its derivative b - L a / S^2 vanishes at
    S* = sqrt(L a / b), where peak ~ 2 sqrt(L a b): memory grows as sqrt(L) instead of L. With
    b = a (a layer saves about its input) that is S* = sqrt(L). Integer rounding and the
    remainder that checkpoint_sequential gives the last segment move the true optimum a little,
    so this searches every S exactly instead of trusting the continuous answer.
    """
    _check_int("num_layers", num_layers, 1)
    best = min(range(1, num_layers + 1),
               key=lambda s: (uniform_peak_bytes(num_layers, s, layer_bytes, boundary_bytes), s))
    return best


def recompute_layers(boundaries, num_layers: int) -> int:
    """Layers run twice under a segmentation: all but those of the last (not checkpointed) one."""
    starts = list(boundaries)
    if not starts or starts[0] != 0 or starts[-1] >= num_layers:
        raise ValueError(f"boundaries must start with 0 and stay below {num_layers}")
    return starts[-1]


# ----------------------------------------------------------------------- recursive bisection
@dataclass(frozen=True)
class BisectionCost:
    """Peak bytes and layer-forwards recomputed by recursive bisection of a uniform chain."""

    peak_bytes: int
    recompute_layers: int


def bisection_cost(num_layers: int, layer_bytes: int, boundary_bytes: int) -> BisectionCost:
    """Memory and recompute of recursive bisection on `num_layers` identical layers.

    The scheme: split n layers into a first half of n // 2 layers, which is checkpointed (its
    input kept), and a second half handled the same way, recursively, without a checkpoint of
    its own; a single layer just runs. In backward the second half is done first with the
    first half's input held (peak b + M(n - n//2)); then the first half is recomputed once and
    processed recursively (peak M(n//2)). So M(1) = a, M(n) = max(b + M(n - n//2), M(n//2)),
    about a + b log2(n); and R(1) = 0, R(n) = R(n - n//2) + n//2 + R(n//2), which is
    (n/2) log2(n) for powers of two: O(log n) memory for O(n log n) extra compute.
    """
    _check_int("num_layers", num_layers, 1)
    _check_int("layer_bytes", layer_bytes)
    _check_int("boundary_bytes", boundary_bytes)

    @lru_cache(maxsize=None)
    def cost(n: int) -> tuple[int, int]:
        if n == 1:
            return layer_bytes, 0
        first = n // 2
        m_first, r_first = cost(first)
        m_second, r_second = cost(n - first)
        return max(boundary_bytes + m_second, m_first), r_second + first + r_first

    peak, recompute = cost(num_layers)
    return BisectionCost(peak, recompute)


# ------------------------------------------------------------------------------------ FLOPs
def dense_training_flops(num_params: int, tokens: int, recompute_fraction: float = 0.0) -> int:
    """FLOPs of one step of a dense model: 2 N T forward, 4 N T backward, plus recomputation.

    A matmul with an (m x k) weight costs 2 m k per token forward (a multiply and an add), and
    twice that backward (gradient of the input and of the weight). Recomputing a fraction f of
    the forward adds f * 2 N T: full recomputation (f = 1) makes a step 8 N T instead of 6 N T,
    4/3 of the work.
    """
    _check_int("num_params", num_params)
    _check_int("tokens", tokens)
    if not 0.0 <= recompute_fraction <= 1.0:
        raise ValueError(f"recompute_fraction must be in [0, 1], got {recompute_fraction}")
    return int(2 * num_params * tokens * (3 + recompute_fraction))


STRATEGIES = ("none", "full", "selective")


def transformer_flops(layers: int, hidden: int, seq: int, batch: int, vocab: int,
                      recompute: str = "none", recomputed_layers: int | None = None) -> int:
    """FLOPs of one training step of a GPT, with recomputation (Narayanan et al. 2021, app.).

    Per layer forward: 24 b s h^2 (QKV, output projection, 4h MLP) + 4 b s^2 h (QK^T and
    softmax x V); logits 2 b s h V. Backward is twice the forward. `recompute="full"` adds one
    forward of `recomputed_layers` layers (default all of them); `"selective"` adds only the
    attention core, 4 b s^2 h per layer. With full recompute of all layers this is the paper's
    96 b s L h^2 (1 + s / 6h + V / 16 L h); without recompute it is 72 b s L h^2
    (1 + s / 6h + V / 12 h L), derived from it (the paper prints only the 96 form).
    """
    for name, v in (("layers", layers), ("hidden", hidden), ("seq", seq), ("batch", batch),
                    ("vocab", vocab)):
        _check_int(name, v, 1)
    if recompute not in STRATEGIES:
        raise ValueError(f"recompute must be one of {STRATEGIES}, got {recompute!r}")
    k = layers if recomputed_layers is None else _check_int("recomputed_layers",
                                                             recomputed_layers)
    if k > layers:
        raise ValueError(f"recomputed_layers ({k}) cannot exceed layers ({layers})")
    layer = 24 * batch * seq * hidden ** 2 + 4 * batch * seq ** 2 * hidden
    logits = 2 * batch * seq * hidden * vocab
    step = 3 * (layers * layer + logits)
    if recompute == "full":
        step += k * layer
    elif recompute == "selective":
        step += k * 4 * batch * seq ** 2 * hidden
    return step


# ------------------------------------------------------------ activations of ckpt_lab.training.models
@dataclass(frozen=True)
class LayerBytes:
    """What one entry of `model.layers()` leaves for backward, derived op by op from its code.

    inner_bytes: tensors it saves that are neither its input nor its output.
    out_bytes: its output. keeps_input / keeps_output: whether it saves those too.
    backward_extra_bytes: gradients alive at once inside its backward, on top of the incoming
    one (measured against `track_memory` in the tests).
    """

    name: str
    inner_bytes: int
    out_bytes: int
    keeps_input: bool
    keeps_output: bool
    backward_extra_bytes: int = 0


def gpt_block_terms(batch: int, seq: int, n_embd: int, n_head: int, dtype_bytes: int = 4,
                    dropout: bool = True, mask_bytes: int | None = None) -> dict[str, int]:
    """Bytes one `models.Block` saves, term by term, in the order its forward runs.

    Next to Megatron's sbh(34 + 5as/h) (16-bit, 1-byte masks), the differences are:
    * dtype: every activation term scales with `dtype_bytes` (4 in fp32, 2 in bf16).
    * dropout masks: on CPU `nn.Dropout` multiplies by a scaled mask of the input's dtype,
      so each mask costs `dtype_bytes` per element, not 1 (CUDA's fused dropout keeps a
      1-byte mask: pass `mask_bytes=1` there; the default is `dtype_bytes`). The attention dropout keeps that mask *and* its output (for x V).
    * transposes: q, k^T and v enter batched matmuls as non-contiguous views, which matmul
      copies; the copies are what is saved (same bytes as Megatron's Q, K, V terms), and the
      qkv output itself is freed. The core's output is made contiguous: the proj input.
    * LayerNorm keeps its mean and rstd (2 numbers per token, in the input's dtype on CPU)
      besides its input.
    * `~mask` builds a fresh T x T bool tensor per block, which masked_fill keeps.
    * fused attention (`attn_impl="sdpa"`) would drop every T^2 term; not modelled here.
    The block's input (the residual stream) is the first term; the block's output is not
    saved by the block itself (the next block's LayerNorm saves it).
    """
    N, C, d = batch * seq, n_embd, dtype_bytes
    NC, T2 = N * C * d, n_head * seq * seq * batch * d
    m = d if mask_bytes is None else mask_bytes
    NCm, T2m = N * C * m, n_head * seq * seq * batch * m
    terms = {
        "ln1 input (residual)": NC,
        "ln1 mean, rstd": 2 * N * d,
        "qkv input (ln1 output)": NC,
        "q copy (for q @ k^T)": NC,
        "k^T copy (for q @ k^T)": NC,
        "causal mask (~mask, bool)": seq * seq,
        "softmax output": T2,
        "attention dropout mask": T2m if dropout else 0,
        "attention dropout output (for @ v)": T2 if dropout else 0,
        "v copy (for @ v)": NC,
        "proj input (contiguous core output)": NC,
        "proj dropout mask": NCm if dropout else 0,
        "ln2 input (residual)": NC,
        "ln2 mean, rstd": 2 * N * d,
        "fc input (ln2 output)": NC,
        "GELU input (4H)": 4 * NC,
        "mlp proj input (GELU output, 4H)": 4 * NC,
        "mlp dropout mask": NCm if dropout else 0,
    }
    return terms


def gpt_block_bytes(batch: int, seq: int, n_embd: int, n_head: int, dtype_bytes: int = 4,
                    dropout: bool = True, mask_bytes: int | None = None) -> int:
    """Total bytes one `models.Block` saves for backward: the sum of `gpt_block_terms`."""
    return sum(gpt_block_terms(batch, seq, n_embd, n_head, dtype_bytes, dropout,
                               mask_bytes).values())


def gpt_layers(batch: int, seq: int, n_layer: int, n_embd: int, n_head: int, vocab: int,
               dtype_bytes: int = 4, dropout: bool = True) -> list[LayerBytes]:
    """`LayerBytes` for every entry of `models.GPT.layers()`: Embed, n_layer Blocks, LMHead."""
    for name, v in (("batch", batch), ("seq", seq), ("n_layer", n_layer), ("n_embd", n_embd),
                    ("n_head", n_head), ("vocab", vocab)):
        _check_int(name, v, 1)
    N, C, d = batch * seq, n_embd, dtype_bytes
    block = gpt_block_terms(batch, seq, n_embd, n_head, d, dropout)
    inner = sum(block.values()) - block["ln1 input (residual)"]
    # Embed keeps the int64 positions (embedding backward needs indices) and its dropout mask.
    embed = LayerBytes("embed", 8 * seq + (N * C * d if dropout else 0), N * C * d, False,
                       False)
    # Block backward peaks in the MLP's down projection: grad of its input (4NC), of its
    # weight (4C^2) and bias (C), while the dropout mask it no longer needs is freed.
    blocks = [LayerBytes(f"block {i}", inner, N * C * d, True, False,
                         4 * N * C * d + 4 * C * C * d + C * d) for i in range(n_layer)]
    head = LayerBytes("head", 2 * N * d + N * C * d, N * vocab * d, True, False,
                      N * C * d + vocab * C * d)
    return [embed, *blocks, head]


def mlp_layers(batch: int, seq: int, depth: int, width: int, vocab: int,
               dtype_bytes: int = 4) -> list[LayerBytes]:
    """`LayerBytes` for `models.MLPChain.layers()` (dropout 0): Embedding, depth blocks, head.

    A block is Linear -> ReLU: the Linear keeps its input, ReLU keeps its output (which the
    next Linear keeps too, one storage); the Linear's output is freed. So an MLP block costs
    one B T H tensor, 2 per block if you count its input as Megatron does.
    """
    for name, v in (("batch", batch), ("seq", seq), ("depth", depth), ("width", width),
                    ("vocab", vocab)):
        _check_int(name, v, 1)
    N, H, d = batch * seq, width, dtype_bytes
    embed = LayerBytes("embed", 0, N * H * d, False, False)
    blocks = [LayerBytes(f"block {i}", 0, N * H * d, True, True, 2 * N * H * d + H * H * d
                         + H * d) for i in range(depth)]
    # head backward: grad of its input, of its weight and of its bias
    head = LayerBytes("head", 0, N * vocab * d, True, False,
                      N * H * d + vocab * H * d + vocab * d)
    return [embed, *blocks, head]


def loss_bytes(tokens: int, vocab: int, dtype_bytes: int = 4) -> int:
    """Cross-entropy keeps log_softmax's output (tokens x vocab) plus two scalars."""
    return tokens * vocab * dtype_bytes + 2 * dtype_bytes


def _live_outputs(layers, lo: int, hi: int) -> int:
    """Bytes of outputs of layers in [lo, hi) that a normal run of [lo, hi) saves."""
    return sum(layers[i].out_bytes for i in range(lo, hi)
               if layers[i].keeps_output or (i + 1 < hi and layers[i + 1].keeps_input))


def chain_peak_bytes(layers: list[LayerBytes], segments, tokens: int, vocab: int,
                     dtype_bytes: int = 4) -> int:
    """Peak bytes of forward + cross-entropy + backward of a chain run in `segments`.

    `segments` is a list of (start, end, checkpointed) spans over `layers`, as
    `models.CheckpointedChain.segments()` returns; the last one must not be checkpointed.
    The candidates for the peak:
    * cross-entropy backward: everything alive at the end of forward plus the grad of
      log_softmax's input and output (2 x tokens x vocab);
    * the head's backward, once log_softmax's output is replaced by its gradient;
    * each checkpointed segment's backward: inputs kept by checkpointed segments up to it,
      what runs before it un-checkpointed, its own recomputed activations, the gradient
      arriving at its output and one layer's backward extra;
    * each layer's backward in a segment run plainly (as `checkpoint_sequential` runs its last
      one): what is kept before the segment, what the segment's layers up to this one saved,
      the gradient arriving at the layer's output and its backward extra.
    """
    spans = [(int(a), int(b), bool(c)) for a, b, c in segments]
    n = len(layers)
    if not spans or spans[0][0] != 0 or spans[-1][1] != n or spans[-1][2] \
            or any(s[1] != t[0] for s, t in zip(spans, spans[1:])):
        raise ValueError("segments must be contiguous (start, end, checkpointed) spans covering "
                         "all layers, the last one not checkpointed")
    def saved(a, b):
        return sum(layer.inner_bytes for layer in layers[a:b]) + \
            _live_outputs(layers, a, b)

    def kept(a):
        return layers[a - 1].out_bytes if a > 0 else 0

    logits = tokens * vocab * dtype_bytes
    def run_input(a):  # a normal span's input, when its first layer saves it
        return layers[a - 1].out_bytes if a > 0 and layers[a].keeps_input else 0

    end_of_forward = sum(kept(a) if c else saved(a, b) + run_input(a) for a, b, c in spans) \
        + loss_bytes(tokens, vocab, dtype_bytes)
    peaks = [end_of_forward + 2 * logits,
             end_of_forward + layers[-1].backward_extra_bytes]
    before = 0
    for a, b, c in spans:
        if c:
            recomputed = saved(a, b)
            grad_out = layers[b - 1].out_bytes
            extra = max(layer.backward_extra_bytes for layer in layers[a:b])
            peaks.append(before + kept(a) + recomputed + grad_out + extra)
            before += kept(a)
        else:
            peaks += [before + saved(a, i + 1) + run_input(a) + layers[i].out_bytes
                      + layers[i].backward_extra_bytes for i in range(a, b)]
            before += saved(a, b) + run_input(a)
    return max(peaks)


# ------------------------------------------------------------ the loss at large vocabularies
def chunk_rows(rows: int, chunks: int) -> list[int]:
    """Rows per chunk as `losses.chunked_cross_entropy` splits them: as equal as can be, the
    first ``rows % chunks`` chunks one row larger."""
    _check_int("rows", rows, 1)
    if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral) \
            or not 1 <= chunks <= rows:
        raise ValueError(f"chunks must be an int from 1 to the number of rows ({rows}), "
                         f"got {chunks!r}")
    base, extra = divmod(rows, chunks)
    return [base + 1] * extra + [base] * (chunks - extra)


def cross_entropy_moments(rows: int, vocab: int, dim: int,
                          dtype_bytes: int = 4) -> dict[str, int]:
    """Bytes alive at each candidate peak of ``F.cross_entropy(hidden @ weight.T, targets)``,
    forward and backward, counted from its input: hidden (N x d) and weight (V x d) exist
    before, the gradients of both are made.

    * forward: the N x V logits and log_softmax's output (the logits are then freed);
    * log_softmax backward: its output, the incoming gradient (nll_loss's, N x V) and the
      logits' gradient it writes: 3 N x V;
    * matmul backward: the logits' gradient, the weight's gradient (V x d) and hidden's (N x d).
    Scalars (the loss, its gradient, nll_loss's total weight: 4 bytes each) are left out.
    """
    for name, v in (("rows", rows), ("vocab", vocab), ("dim", dim)):
        _check_int(name, v, 1)
    NV, Vd, Nd = (rows * vocab * dtype_bytes, vocab * dim * dtype_bytes,
                  rows * dim * dtype_bytes)
    return {"forward: logits and log-softmax": 2 * NV,
            "log_softmax backward": 3 * NV,
            "matmul backward": NV + Vd + Nd}


def cross_entropy_peak_bytes(rows: int, vocab: int, dim: int, dtype_bytes: int = 4) -> int:
    """Peak bytes of the unchunked loss: max(3 N V, N V + V d + N d) elements (`cross_entropy_moments`)."""
    return max(cross_entropy_moments(rows, vocab, dim, dtype_bytes).values())


def chunked_cross_entropy_moments(rows: int, vocab: int, dim: int, chunks: int,
                                  dtype_bytes: int = 4, tracked: bool = False) -> dict[str, int]:
    """Bytes alive at each candidate peak of `losses.chunked_cross_entropy`, counted as in
    `cross_entropy_moments` (hidden and weight given, both gradients made, scalars left out).

    Chunk j has s_j rows (`chunk_rows`); backward runs the chunks last to first, and before
    chunk j it has finished the rows after it (done_j) and holds the weight's gradient (V x d)
    summed so far (none before the first). Candidates, the largest over chunks of each:

    * forward: one chunk's logits and log-softmax, 2 s V (then the checkpoint drops both);
    * log_softmax backward of chunk j: done_j d + [V d] + 3 s_j V: the recomputed
      log-softmax, nll_loss's gradient and the logits' gradient;
    * matmul backward of chunk j: done_j d + [V d] + s_j V + V d + s_j d: the logits'
      gradient, this chunk's weight gradient beside the running sum, its row gradient;
    * weight-gradient accumulation: autograd sums the chunks' V x d gradients in the weight's
      input buffer. The first sum is out of place (each chunk's gradient arrives as a view,
      through ``weight.t()``'s backward, which the engine does not add into), so old, new and
      sum coexist: 3 V d + (done + s) d; the sum is a fresh tensor, and later chunks are added
      into it in place. ``tracked=True`` gives what `track_memory` measures: under any
      ``TorchDispatchMode`` the engine never adds in place (it treats every tensor as a
      subclass while a mode is active), so every chunk after the first pays 3 V d;
    * the end: hidden's gradient gathered from the chunks' row gradients (``split``'s
      backward concatenates them): 2 N d + V d.
    """
    for name, v in (("rows", rows), ("vocab", vocab), ("dim", dim)):
        _check_int(name, v, 1)
    sizes = chunk_rows(rows, chunks)
    V, d, b = vocab, dim, dtype_bytes
    Vd = V * d * b
    out = {"forward: one chunk's logits and log-softmax": 2 * max(sizes) * V * b,
           "log_softmax backward of a chunk": 0, "matmul backward of a chunk": 0}
    done = 0
    for j, s in enumerate(reversed(sizes)):
        held = done * d * b + (Vd if j else 0)
        out["log_softmax backward of a chunk"] = max(out["log_softmax backward of a chunk"],
                                                     held + 3 * s * V * b)
        out["matmul backward of a chunk"] = max(out["matmul backward of a chunk"],
                                                held + s * V * b + Vd + s * d * b)
        if j == 1 or (j > 1 and tracked):
            key = "weight-gradient accumulation (out of place)"
            out[key] = max(out.get(key, 0), 3 * Vd + (done + s) * d * b)
        done += s
    out["end: hidden's gradient gathered"] = 2 * rows * d * b + Vd
    return out


def chunked_cross_entropy_peak_bytes(rows: int, vocab: int, dim: int, chunks: int,
                                     dtype_bytes: int = 4, tracked: bool = False) -> int:
    """Peak bytes of `losses.chunked_cross_entropy`: the largest `chunked_cross_entropy_moments`.

    For chunks of c rows it is about max(3 c V + V d + N d, 3 V d, 2 N d + V d) elements
    where the unchunked loss needs 3 N V: the logits' share falls with the chunk count until
    the weight's gradient (summed over chunks) and hidden's gradient, which no chunking
    removes, dominate.
    """
    return max(chunked_cross_entropy_moments(rows, vocab, dim, chunks, dtype_bytes,
                                             tracked).values())
