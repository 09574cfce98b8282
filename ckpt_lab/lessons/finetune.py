"""Fine-tuning's model state measured on a CPU, for lesson 8 and its tests.

A tiny Llama is built from a `transformers` config (random weights: nothing is downloaded,
``HF_HUB_OFFLINE=1``); peft puts LoRA adapters on every linear layer of its blocks; the base
is kept in bf16 or quantised by bitsandbytes (NF4 4-bit or LLM.int8 8-bit, both run on a CPU
with bitsandbytes 0.50); the optimizer is torch's AdamW or bitsandbytes' 8-bit AdamW. One
training step runs inside `track_memory`, and what stays allocated after it (weights,
adapters, their gradients, the optimizer's state) is the model state that
`formulas.lora_state_bytes` predicts from the config alone.
"""
from __future__ import annotations

import logging
import os
import warnings
from functools import lru_cache

import torch

from ckpt_lab import formulas, track_memory

# Offline, and quiet: bitsandbytes logs that an optional CPU kernel package (which would download
# a kernel, so it is not installed) is missing; peft calls a transformers method that warns it
# was renamed. Neither changes a number here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

# Smallest sizes at which every adapter tensor holds >= 4096 values except k and v's B (GQA),
# so bitsandbytes' 8-bit AdamW quantises most of them and keeps a few in fp32.
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
OPTIMIZERS = ("adamw", "adamw8bit", "paged_adamw8bit")


def _quiet_imports():
    """peft and bitsandbytes, or an ImportError that says how to install them."""
    try:
        import bitsandbytes
        import peft
    except ImportError as e:
        raise ImportError("lesson 8's fine-tuning section needs peft and bitsandbytes: "
                          "pip install 'peft==0.21.2' 'bitsandbytes==0.50.2'") from e
    return peft, bitsandbytes


def tiny_llama(seed: int = 0, dtype=torch.bfloat16, **overrides):
    """A `LlamaForCausalLM` of `TINY` sizes (or `overrides`), random weights, in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).to(dtype)


def quantize_linears(model, bits: int):
    """Swap every block's nn.Linear for bitsandbytes' 4-bit (NF4, double-quantised) or 8-bit
    (LLM.int8) layer holding the same weights, as transformers' BitsAndBytesConfig does."""
    _, bnb = _quiet_imports()
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    for block in model.model.layers:
        for parent in (block.self_attn, block.mlp):
            for name, lin in list(parent.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                w = lin.weight.data
                if bits == 4:
                    q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False,
                                          compute_dtype=w.dtype, quant_type="nf4",
                                          compress_statistics=True)
                    q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4",
                                                 compress_statistics=True)
                else:
                    q = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=False,
                                            has_fp16_weights=False)
                    q.weight = bnb.nn.Int8Params(w, requires_grad=False,
                                                 has_fp16_weights=False)
                setattr(parent, name, q.to(w.device))      # .to() quantises
    return model


def make_optimizer(params, name: str = "adamw", lr: float = 1e-3):
    """torch's AdamW, or bitsandbytes' 8-bit AdamW (paged: the same state, in paged memory)."""
    _, bnb = _quiet_imports()
    makers = {"adamw": torch.optim.AdamW, "adamw8bit": bnb.optim.AdamW8bit,
              "paged_adamw8bit": bnb.optim.PagedAdamW8bit}
    if name not in makers:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    return makers[name](params, lr=lr)


@lru_cache(maxsize=None)
def measured_state(rank: int = 16, base_bits: int = 16, optimizer: str = "adamw",
                   seed: int = 0) -> int:
    """Bytes still allocated after building the tiny Llama, adding LoRA and taking one AdamW
    step: the model state, measured (`track_memory`, all of it made inside)."""
    peft, _ = _quiet_imports()
    x = torch.randint(0, TINY["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(0))
    with track_memory() as mem, warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # paged on a CPU: "falling back"
        model = tiny_llama(seed)
        if base_bits != 16:
            quantize_linears(model, base_bits)
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                 target_modules="all-linear")
        model = peft.get_peft_model(model, config)
        opt = make_optimizer([p for p in model.parameters() if p.requires_grad], optimizer)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    return mem.current_bytes


def planned_state(rank: int = 16, base_bits: int = 16,
                  optimizer: str = "adamw") -> formulas.FinetuneStateBytes:
    """The same model state from the config alone (`formulas.lora_state_bytes`)."""
    shapes, other = tiny_shapes()
    return formulas.lora_state_bytes(shapes, other, rank, base_bits, optimizer)


def tiny_shapes() -> tuple[list, int]:
    """(d_out, d_in) of every block's linear layer of the tiny Llama, and its other params."""
    t = TINY
    per_block = formulas.transformer_linear_shapes(
        t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], "swiglu",
        t["intermediate_size"])
    shapes = list(per_block.values()) * t["num_hidden_layers"]
    params = formulas.transformer_params(
        t["num_hidden_layers"], t["hidden_size"], t["num_attention_heads"], t["vocab_size"],
        kv_heads=t["num_key_value_heads"], mlp="swiglu", intermediate=t["intermediate_size"],
        style="llama")
    return shapes, params - sum(o * i for o, i in shapes)
