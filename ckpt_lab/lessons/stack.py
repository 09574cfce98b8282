"""PyTorch's own switches beside ckpt_lab's from-scratch ones, measured on the same block.

* Selective checkpointing: ``torch.utils.checkpoint`` with ``context_fn`` built by
  ``create_selective_checkpoint_contexts`` and a policy returning a ``CheckpointPolicy``
  (``MUST_SAVE`` for matmuls, ``PREFER_RECOMPUTE`` for the rest) against
  ``ckpt_lab.checkpoint(..., policy="save_matmuls")``: bytes kept, gradients, FLOPs.
* Fused attention: with ``F.scaled_dot_product_attention`` the T x T scores never exist, so
  checkpointing the attention core alone (Megatron's selective recomputation) has almost
  nothing left to free; `attention_core_saving` measures both cores.
* Offload: ``torch.autograd.graph.save_on_cpu`` copies every saved tensor (weights and views
  included) to the host; ``ckpt_lab.offload_activations`` moves each activation storage once
  and leaves weights alone. `compare_offload` counts both (on CPU nothing can move, so this is
  accounting; on CUDA it also reads the device's peak).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ckpt_lab.checkpoint import checkpoint
from ckpt_lab.memory import track_memory
from ckpt_lab.offload import offload_activations
from ckpt_lab.selective import MATMUL_OPS


# ------------------------------------------------------------------------------- selective
def torch_save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """PyTorch's policy form of ckpt_lab's ``save_matmuls``: keep matmul outputs."""
    if op.overloadpacket in MATMUL_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def torch_selective(fn, *args, policy=torch_save_matmuls, **kwargs):
    """``torch.utils.checkpoint`` (non-reentrant) with a selective policy."""
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, context_fn=context,
                                             **kwargs)


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


def compare_selective(block, x, seed: int = 0) -> dict[str, Measured]:
    """A block plain, fully checkpointed, and saving matmuls the ckpt_lab and the PyTorch way."""
    runs = {
        "plain": lambda t: block(t),
        "full recompute (ckpt_lab)": lambda t: checkpoint(block, t),
        "save_matmuls (ckpt_lab)": lambda t: checkpoint(block, t, policy="save_matmuls"),
        "save_matmuls (PyTorch SAC)": lambda t: torch_selective(block, t),
    }
    return {name: measure(name, run, block, x, seed) for name, run in runs.items()}


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


# --------------------------------------------------------------------------------- offload
class counting_save_on_cpu(torch.autograd.graph.save_on_cpu):
    """``save_on_cpu`` that also counts what its pack hook copies: ``.bytes_copied``."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda"):
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        self.bytes_copied, self.tensors = 0, 0
        pack = self.pack_hook

        def counted(t):
            self.bytes_copied += t.numel() * t.element_size()
            self.tensors += 1
            return pack(t)

        self.pack_hook = counted


@dataclass
class OffloadComparison:
    """Host traffic of each offload for one forward (bytes sent to the host) and, on CUDA,
    the device's peak during the step."""

    save_on_cpu_bytes: int
    save_on_cpu_tensors: int
    ckpt_lab_bytes: int
    ckpt_lab_storages: int
    weight_bytes: int
    cuda_peak_bytes: dict


def _cuda_peak(step) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def compare_offload(model, x) -> OffloadComparison:
    """Forward + backward of ``model(x).pow(2).sum()`` under each offload, counted."""
    cuda = x.is_cuda

    def step(ctx):
        with ctx:
            y = model(x).pow(2).sum()
        y.backward()
        model.zero_grad(set_to_none=True)

    theirs = counting_save_on_cpu(pin_memory=cuda)
    step(theirs)
    with offload_activations() as ours:
        y = model(x).pow(2).sum()
    y.backward()
    model.zero_grad(set_to_none=True)
    peaks = {}
    if cuda:
        import contextlib
        peaks = {"plain": _cuda_peak(lambda: step(contextlib.nullcontext())),
                 "save_on_cpu": _cuda_peak(lambda: step(torch.autograd.graph.save_on_cpu(True))),
                 "offload_activations": _cuda_peak(lambda: step(offload_activations()))}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return OffloadComparison(theirs.bytes_copied, theirs.tensors, ours.bytes_offloaded,
                             ours.storages, weights, peaks)
