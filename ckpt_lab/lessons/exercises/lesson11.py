"""Exercises of lesson 11: Checkpointing in your stack."""
from __future__ import annotations

import functools

import torch
from torch import nn

from .base import Exercise, _close


def _kv_cache_mib(answer):
    from types import SimpleNamespace

    from ckpt_lab.lessons.hf import kv_cache_bytes
    config = SimpleNamespace(num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                             hidden_size=512)
    expected = kv_cache_bytes(config, batch=4, seq=1024, dtype_bytes=2) / 2 ** 20
    return _close(answer, expected, 0.01,
                  "Too few: the cache holds keys AND values, for every layer, for the KV heads "
                  "(2 here, not 8), each head_dim = hidden / heads wide.",
                  "Too many: grouped-query attention caches only the 2 KV heads, not all 8 "
                  "query heads; bf16 is 2 bytes; 1 MiB is 2**20 bytes.")


@functools.lru_cache(maxsize=None)
def trap_adapters_with_grad(layers: int = 6, every: int = 3) -> int:
    """Measured: adapter tensors that get a gradient when a tiny Llama with LoRA on q_proj and
    v_proj (everything else frozen) is checkpointed reentrantly on every `every`-th layer,
    without enable_input_require_grads."""
    from ckpt_lab.lessons import hf
    model = hf.tiny_model("llama", layers=layers)
    hf.add_lora(model)
    hf.enable_checkpointing(model, use_reentrant=True, every_n_layers=every)
    model.disable_input_require_grads()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.train_step(model, hf.token_batch(2, 16, 256))
    return hf.trainable_with_grad(model)


def _trap_adapters(answer):
    expected = trap_adapters_with_grad()
    return _close(answer, expected, 1e-9,
                  "Too few: a reentrant checkpoint loses gradients only when none of its inputs "
                  "requires grad. Which checkpointed layers get an input computed by trainable "
                  "adapters in an earlier layer?",
                  "Too many: layer 0 is checkpointed and its input, the frozen embedding's "
                  "output, does not require grad: its adapters (A and B of q_proj and v_proj) "
                  "get nothing.")


@functools.lru_cache(maxsize=None)
def compiled_kept_mib(depth: int = 8, rows: int = 512, width: int = 256) -> float:
    """Measured: MiB the compiled forward of a Linear+GELU chain keeps for backward at
    activation_memory_budget=1.0 (same partitioner as inductor, eager execution)."""
    from ckpt_lab.lessons.compiled import budget_sweep

    def make():
        torch.manual_seed(0)
        return nn.Sequential(*[m for _ in range(depth)
                               for m in (nn.Linear(width, width), nn.GELU())])
    row = budget_sweep(make, torch.randn(rows, width), budgets=(1.0,),
                       backend="aot_eager_decomp_partition", repeats=1)[0]
    return row.kept_bytes / 2 ** 20


def _compiled_kept(answer):
    expected = compiled_kept_mib()
    return _close(answer, expected, 0.02,
                  "Too few: each block keeps two (rows x width) fp32 tensors for backward: the "
                  "Linear's output (GELU's backward reads it) and the GELU's output (the next "
                  "Linear's weight gradient, or the loss, reads it).",
                  "Too many: the chain's input x existed before the step (it is not allocated "
                  "by the forward), and nothing else survives to the backward at budget 1.0.")


EXERCISES = [
    Exercise("11.kv_cache_mib", "A Llama-style model, 8 layers, hidden 512, 8 query heads and 2 "
             "key/value heads, trained in bf16 with use_cache=True on batch 4 x 1024 tokens "
             "with every layer checkpointed: how many MiB does the key/value cache pin?",
             _kv_cache_mib),
    Exercise("11.trap_adapters", "A 6-layer tiny Llama, LoRA (A and B) on q_proj and v_proj of "
             "every layer, everything else frozen, checkpointed with use_reentrant=True and "
             "every_n_layers=3, input grads NOT enabled: how many of the 24 adapter tensors "
             "get a gradient?", _trap_adapters),
    Exercise("11.compiled_kept_mib", "8 blocks of Linear(256, 256) -> GELU on a (512, 256) fp32 "
             "batch, compiled with activation_memory_budget=1.0: how many MiB does the "
             "forward keep for the backward?", _compiled_kept),
]
