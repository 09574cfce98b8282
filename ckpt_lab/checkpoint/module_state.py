"""The parameters, buffers and plain attributes a checkpointed function's modules had when its
forward ran. (Design note 5, in NOTES.md.)

A recompute re-runs the forward inside backward, reading every module attribute again. Four
things can make it read something else than the forward did, each a silent wrong gradient in
``torch.utils.checkpoint``:

* the forward changed a buffer itself: a QAT ``FakeQuantize`` observer widening its range,
  ``spectral_norm``'s power iteration, a ``self.step += 1`` counter, batch norm's running
  statistics. The recompute would start from the updated values.
* the forward changed a plain attribute: a call counter a pre-hook keeps, Hugging Face's
  dynamic RoPE recording the longest sequence seen (``max_seq_len_cached``) beside the buffer
  it re-registers. The recompute would take another branch.
* a buffer was modified in place between forward and backward.
* a parameter or buffer was replaced by another object (``m.weight = nn.Parameter(...)``).

`ModuleState` makes the first, second and fourth exact and refuses the third, for the modules
the checkpoint finds (``hidden_inputs.modules_of``) and their submodules, of which it keeps
watching those that ran in the forward (a buffer read outside its module's forward is caught
only by ``determinism_check="fingerprint"``):

* at the forward's entry it records every parameter and buffer object and its version, and
  copies the *persistent* buffers (those in ``state_dict``: the module's state; a
  non-persistent buffer is a cache such as a causal mask, and copying one would cost memory
  for nothing);
* after the forward it keeps the copy of each buffer the forward changed (its version counter
  moved, or the module now holds another object) and drops the rest;
* it keeps a shallow copy of each module's ``__dict__`` (its plain attributes: ints, flags,
  ``training``, tensors that are no buffer), and around the recompute every attribute that is
  not the object it was at the forward's entry is set back to that object (one the forward
  added is taken away), and put back after: what changes inside a container held in an
  attribute (a list appended to) is not seen;
* around the recompute it puts the forward's objects back in place, each changed buffer as a
  fresh copy of its entry value, and each buffer the forward saved for backward as a fresh
  copy of its current value (batch norm updates its running statistics without moving their
  version, but saves them; its output in training does not depend on them), then restores
  what the modules held before, as the RNG replay does with the generator states: the
  recompute updates throw-away copies, so batch norm counts a batch once, as without a
  checkpoint. (A checkpoint nested in another reports what it saves to the enclosing ones
  too, `saw_saved`: the outer recompute runs the inner forward again, on copies.)

What it costs, all of it visible to ``track_memory``: one copy of the persistent buffers during
the forward; after it, until backward, the copies of the buffers the forward changed (batch
norm: its 8-byte batch counter); during the recompute, fresh copies of the changed and saved
buffers (batch norm: its counter, until the recompute ends, and its two statistics, held by its
saved tensors until its backward); a copy of each module's attribute dictionary (Python objects,
not tensors) until backward; and a Python loop over the modules' parameters, buffers and
attributes. ``profile.profile_layers`` measures these
copies per layer and ``planner.step_peak_bytes`` counts each where it lives.
"""
from __future__ import annotations

import contextlib
import operator
import threading

import torch
from torch import nn

_local = threading.local()


def _watching() -> list:
    """The states whose forward is running in this thread, outermost first."""
    if not hasattr(_local, "states"):
        _local.states = []
    return _local.states


def saw_saved(t: torch.Tensor):
    """Note that a forward saved ``t`` for backward (a checkpoint's pack hook calls this): every
    enclosing checkpoint's forward saved it too, through the one nested in it."""
    for state in _watching():
        state.mark_saved(t)


_SAME, _SAVED, _CHANGED = "same", "saved", "changed"
_MISSING = object()          # an attribute the module did not have


class _Buffer:
    """One buffer slot: the object the forward started with, and what the recompute needs."""

    __slots__ = ("module", "name", "obj", "version", "entry", "mode")

    def __init__(self, module: nn.Module, name: str, obj: torch.Tensor, persistent: bool):
        self.module, self.name, self.obj, self.version = module, name, obj, obj._version
        self.entry = obj.detach().clone() if persistent else None
        self.mode = _SAME            # _SAVED by the forward, or _CHANGED by it (see settle)


class ModuleState:
    """Parameters and buffers of ``modules`` (and their submodules) at the forward's entry."""

    def __init__(self, modules):
        self.params: list[tuple[nn.Module, str, nn.Parameter]] = []
        self.buffers: list[_Buffer] = []
        self.attributes: list[tuple[nn.Module, dict]] = []   # (module, its __dict__ copied)
        todo, seen = list(modules), set()
        while todo:                        # (Module.modules() builds a name for each one)
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            todo += [c for c in m._modules.values() if c is not None]
            self.attributes.append((m, dict(m.__dict__)))
            self.params += [(m, n, p) for n, p in m._parameters.items() if p is not None]
            if m._buffers:
                skip = m._non_persistent_buffers_set
                self.buffers += [_Buffer(m, n, b, n not in skip)
                                 for n, b in m._buffers.items() if b is not None]
        self._by_id = {id(b.obj): b for b in self.buffers}
        self.settled = False

    @contextlib.contextmanager
    def watching(self):
        """The forward: the modules that run and what it saves are noted; then `settle`."""
        states = _watching()
        states.append(self)
        self.ran = set()
        hook = nn.modules.module.register_module_forward_pre_hook(
            lambda module, args: self.ran.add(id(module)))
        try:
            yield
        finally:
            hook.remove()
            states.remove(self)
        self.settle()

    def mark_saved(self, t: torch.Tensor):
        """``t`` was saved for backward: if it is one of these buffers, recompute on a copy."""
        b = self._by_id.get(id(t))
        if b is not None and b.obj is t and b.mode is _SAME:
            b.mode = _SAVED

    def settle(self):
        """After the forward: keep the entry copies of buffers it changed, drop the others.

        Only buffers the forward changed or could read stay watched: those of modules that ran
        in it. A closure over a whole model (``lambda h: self.blocks[i](h)``) reaches every
        block, and the batch norms of later blocks update their statistics before this
        checkpoint's backward: that is no change to what this recompute reads."""
        ran = getattr(self, "ran", None)
        if ran is not None:
            self.buffers = [b for b in self.buffers if id(b.module) in ran
                            or b.module._buffers.get(b.name) is not b.obj
                            or b.obj._version != b.version]
            self.params = [(m, n, p) for m, n, p in self.params if id(m) in ran]
            self.attributes = [(m, a) for m, a in self.attributes if id(m) in ran]
        for b in self.buffers:
            if b.module._buffers.get(b.name) is not b.obj or b.obj._version != b.version:
                b.mode = _CHANGED
                if b.entry is None and b.obj._version == b.version:
                    b.entry = b.obj        # replaced by the forward, not modified: itself
            else:
                b.entry = None
            b.version = b.obj._version     # where a change after this point is someone else's
        self._by_id = {}
        self.settled = True

    def parameters_read(self) -> list:
        """After the forward: the parameters of the modules that ran in it."""
        return [p for _, _, p in self.params]

    def drop_hooks_since(self, first: int):
        """Remove the hooks registered since the handle id ``first`` (by a recompute that
        stopped early, before the function removed them) from these modules and the global
        module hooks."""
        tables = [v for m, _ in self.attributes for k, v in vars(m).items()
                  if "hooks" in k and isinstance(v, dict)]
        tables += [v for k, v in vars(nn.modules.module).items()
                   if k.startswith("_global_") and "hooks" in k and isinstance(v, dict)]
        for table in tables:
            for key in [k for k in table if isinstance(k, int) and k >= first]:
                del table[key]

    def check(self, error=RuntimeError):
        """Refuse a buffer that was modified in place between forward and backward."""
        for b in self.buffers:
            if b.mode is _CHANGED and b.entry is None:
                raise error(
                    f"the checkpointed function modified the non-persistent buffer "
                    f"'{b.name}' of {type(b.module).__name__} in place, and ckpt_lab copies "
                    "only persistent buffers to replay them, so the recompute would start "
                    "from the new value. Register it with persistent=True, or pass it as an "
                    "argument.")
            if b.mode is not _CHANGED and b.obj._version != b.version:
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
            if not self.settled:           # a recompute inside the forward (autograd.grad)
                want = b.obj if b.entry is None else b.entry.clone()
            elif b.mode is _CHANGED:
                want = b.entry.clone()
            elif b.mode is _SAVED:         # the recompute may update it again: a copy
                want = b.obj.detach().clone()
            else:
                want = b.obj
            if now is not want:
                undo.append((b.module._buffers, b.name, now))
                b.module._buffers[b.name] = want
        for m, entry in self.attributes:
            _swap_attributes(m.__dict__, entry, undo)
        return undo

    @staticmethod
    def swap_out(undo: list):
        """Restore what the modules held before `swap_in`."""
        for table, name, value in reversed(undo):
            if value is _MISSING:
                table.pop(name, None)
            else:
                table[name] = value


def _swap_attributes(now: dict, entry: dict, undo: list):
    """Set a module's attributes back to the objects they were at the forward's entry."""
    if len(now) == len(entry) and all(map(operator.is_, now.values(), entry.values())) \
            and all(map(operator.is_, now, entry)):
        return                             # nothing changed (the usual case): a loop in C
    for name, value in entry.items():
        held = now.get(name, _MISSING)
        if held is not value:
            undo.append((now, name, held))
            now[name] = value
    if len(now) != len(entry):
        for name in [n for n in now if n not in entry]:
            undo.append((now, name, now.pop(name)))
