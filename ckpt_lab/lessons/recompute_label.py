"""Label PyTorch's own recompute in `track_memory` timelines, so a lesson can draw it orange.

`ckpt_lab.checkpoint` marks its recompute itself (`ckpt_lab.measure.memory.phase("recompute")`);
`torch.utils.checkpoint` does not, so its recomputed forward would read as "backward". A lesson
that shows the real call wraps it::

    with track_memory() as log, label_recompute(chain):
        torch.utils.checkpoint.checkpoint(chain, x, use_reentrant=False).sum().backward()

Every forward of a module of ``chain`` that runs while autograd executes a backward node is a
recompute (nothing else runs a module's forward inside backward), and its operations are
labelled "recompute". The hooks are removed when the block ends; a recompute that stops
early (PyTorch raises inside it) still closes its label.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ckpt_lab.measure.memory import phase


@contextlib.contextmanager
def label_recompute(*modules: nn.Module):
    """Within the block, label forwards of these modules run inside backward as "recompute"."""
    if not modules or not all(isinstance(m, nn.Module) for m in modules):
        raise TypeError("label_recompute takes the nn.Module(s) that checkpoint re-runs, "
                        "e.g. label_recompute(chain)")
    open_labels: dict[int, list] = {}

    def enter(module, _args):
        if torch._C._current_autograd_node() is not None:
            label = phase("recompute")
            label.__enter__()
            open_labels.setdefault(id(module), []).append(label)

    def leave(module, _args, _out):
        stack = open_labels.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    handles = []
    for top in modules:
        for module in top.modules():
            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
