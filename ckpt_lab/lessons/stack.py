"""Measuring PyTorch's own switches on one block: bytes kept, FLOPs, gradients, host traffic.

Lesson 11 types the calls themselves (``create_selective_checkpoint_contexts`` with a policy,
``torch.autograd.graph.save_on_cpu``) in its cells; this module only measures around them:

* `measure`: one forward and backward of ``run(x)`` under `track_memory` and a FLOP counter
  that also knows the CPU fused-attention kernel (``FlopCounterMode`` alone counts it as 0).
* `attention_core_saving`: a ckpt_lab GPT block plain and with only its attention core
  checkpointed (Megatron's selective recomputation). With ``F.scaled_dot_product_attention``
  the T x T scores never exist, so there is almost nothing left to free.
* `counting_save_on_cpu`: ``save_on_cpu`` that also counts what its pack hook copies.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ckpt_lab.measure.memory import track_memory


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args,
                             out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# FlopCounterMode knows the CUDA attention kernels but not the CPU one (it would count 0).
_aten = torch.ops.aten
CPU_SDPA_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
}


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` that also counts the CPU fused-attention kernel and its backward."""
    return FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOPS)


@dataclass
class Measured:
    """One way of running a block: bytes kept after its forward, the step's peak, FLOPs of
    forward + backward (recompute included), and the gradients (input first)."""

    setting: str
    kept_bytes: int
    peak_bytes: int
    flops: int
    grads: list


def measure(setting: str, run, module, x, seed: int = 0) -> Measured:
    """Run ``run(x)`` forward and backward (loss = sum of squares) with a fixed seed."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    torch.manual_seed(seed)
    with flop_counter() as flops, track_memory() as mem:
        y = run(x)
        kept = mem.current_bytes
        y.pow(2).sum().backward()
    grads = [x.grad] + [p.grad for p in module.parameters()]
    return Measured(setting, kept, mem.peak_bytes, flops.get_total_flops(), grads)


def same(a: Measured, b: Measured, exact: bool = True) -> bool:
    """Equal gradients: bitwise, or to float tolerance with ``exact=False`` (for CUDA)."""
    eq = torch.equal if exact else (lambda u, v: torch.allclose(u, v, rtol=1e-4, atol=1e-6))
    return len(a.grads) == len(b.grads) and all(
        (u is None and v is None) or (u is not None and v is not None and eq(u, v))
        for u, v in zip(a.grads, b.grads))


def attention_core_saving(block, x, seed: int = 0) -> dict[str, Measured]:
    """The block plain and with only its attention core checkpointed (Megatron's selective)."""
    def core_checkpointed(t):
        block.attn.core_impl = "hooks"
        try:
            return block(t)
        finally:
            block.attn.core_impl = None
    return {"plain": measure("plain", block, block, x, seed),
            "attention core recomputed": measure("attention core recomputed",
                                                 core_checkpointed, block, x, seed)}


class counting_save_on_cpu(torch.autograd.graph.save_on_cpu):
    """``save_on_cpu`` that also counts what its pack hook copies: ``.bytes_copied``,
    ``.tensors``."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda"):
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        self.bytes_copied, self.tensors = 0, 0
        pack = self.pack_hook

        def counted(t):
            self.bytes_copied += t.numel() * t.element_size()
            self.tensors += 1
            return pack(t)

        self.pack_hook = counted

    def __enter__(self) -> "counting_save_on_cpu":
        super().__enter__()
        return self
