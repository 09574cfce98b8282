"""The parameters and buffers a checkpointed function's modules had when its forward ran.

A recompute re-runs the forward inside backward, reading every module attribute again. Three
things can make it read something else than the forward did, each a silent wrong gradient in
``torch.utils.checkpoint``:

* the forward changed a buffer itself: a QAT ``FakeQuantize`` observer widening its range,
  ``spectral_norm``'s power iteration, a ``self.step += 1`` counter, batch norm's running
  statistics. The recompute would start from the updated values.
* a buffer was modified in place between forward and backward.
* a parameter or buffer was replaced by another object (``m.weight = nn.Parameter(...)``).

`ModuleState` makes the first and the third exact and refuses the second, for the modules the
checkpoint finds (``checkpoint._modules_of``) and their submodules:

* at the forward's entry it records every parameter and buffer object, and copies the
  *persistent* buffers (those in ``state_dict``: the module's state; a non-persistent buffer is
  a cache such as a causal mask, and copying one would cost memory for nothing);
* after the forward it keeps the copy of each buffer the forward changed (its version counter
  moved, or the module now holds another object) or saved for backward (batch norm updates
  its running statistics without moving their version, but saves them), and drops the rest;
* around the recompute it puts the forward's objects back in place, with a fresh copy of each
  kept entry value, then restores what the modules held before (as the RNG replay does with the
  generator states): the recompute updates throw-away copies, so batch norm counts a batch
  once, as without a checkpoint.

What it costs: one copy of the persistent buffers per call during the forward (batch norm:
two vectors of its width and a counter), kept until backward only for the changed or saved
ones, and a Python loop over the modules' parameters and buffers.
"""
from __future__ import annotations

import torch
from torch import nn


class _Buffer:
    """One buffer slot: the object the forward started with, and what the recompute needs."""

    __slots__ = ("module", "name", "obj", "version", "entry", "replay")

    def __init__(self, module: nn.Module, name: str, obj: torch.Tensor, persistent: bool):
        self.module, self.name, self.obj, self.version = module, name, obj, obj._version
        self.entry = obj.detach().clone() if persistent else None
        self.replay = False          # the forward changed or saved it: recompute from `entry`


class ModuleState:
    """Parameters and buffers of ``modules`` (and their submodules) at the forward's entry."""

    def __init__(self, modules):
        self.params: list[tuple[nn.Module, str, nn.Parameter]] = []
        self.buffers: list[_Buffer] = []
        todo, seen = list(modules), set()
        while todo:                        # (Module.modules() builds a name for each one)
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            todo += [c for c in m._modules.values() if c is not None]
            self.params += [(m, n, p) for n, p in m._parameters.items() if p is not None]
            if m._buffers:
                skip = m._non_persistent_buffers_set
                self.buffers += [_Buffer(m, n, b, n not in skip)
                                 for n, b in m._buffers.items() if b is not None]
        self._by_id = {id(b.obj): b for b in self.buffers}

    def saw_saved(self, t: torch.Tensor):
        """Note that the forward saved ``t`` for backward (a pack hook calls this)."""
        b = self._by_id.get(id(t))
        if b is not None and b.obj is t:
            b.replay = True

    def settle(self):
        """After the forward: keep the entry copies of buffers it changed or saved, drop others."""
        for b in self.buffers:
            changed = b.module._buffers.get(b.name) is not b.obj or b.obj._version != b.version
            b.replay = b.replay or changed
            if not b.replay:
                b.entry = None
            elif b.entry is None and b.obj._version == b.version:
                b.entry = b.obj            # replaced by the forward, not modified: itself
            b.version = b.obj._version     # where a change after this point is someone else's
        self._by_id = {}

    def check(self, error=RuntimeError):
        """Refuse a buffer that was modified in place between forward and backward."""
        for b in self.buffers:
            if b.replay and b.entry is None:
                raise error(
                    f"the checkpointed function modified the non-persistent buffer "
                    f"'{b.name}' of {type(b.module).__name__} in place, and ckpt_lab copies "
                    "only persistent buffers to replay them, so the recompute would start "
                    "from the new value. Register it with persistent=True, or pass it as an "
                    "argument.")
            if not b.replay and b.obj._version != b.version:
                raise error(
                    f"buffer '{b.name}' of {type(b.module).__name__} was modified in place "
                    "between the forward and the backward; the recompute would read the new "
                    "value and give the gradients of a network that never ran. Change "
                    "buffers after backward, or pass the tensor as an argument.")

    def swap_in(self) -> list:
        """Put the forward's parameters and buffers in place; returns what to restore after."""
        undo = []
        for m, n, p in self.params:
            now = m._parameters.get(n)
            if now is not p:
                undo.append((m._parameters, n, now))
                m._parameters[n] = p
        for b in self.buffers:
            now = b.module._buffers.get(b.name)
            want = b.entry.clone() if b.replay else b.obj
            if now is not want:
                undo.append((b.module._buffers, b.name, now))
                b.module._buffers[b.name] = want
        return undo

    @staticmethod
    def swap_out(undo: list):
        """Restore what the modules held before `swap_in`."""
        for table, name, value in reversed(undo):
            table[name] = value
