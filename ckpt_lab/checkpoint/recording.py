"""What both full designs do the same way: run the forward recording what it saves, and check
what the recompute gives back against that record. (Design notes 6, 7 and 9, in NOTES.md.)

`hooks` and `reentrant` differ in what they keep and how they differentiate the recompute; they
share how the forward runs (`run_forward`: under the module-state watch, the saved-tensor hooks
and ``context_fn``'s forward context, then the graph walk that adds the leaves it read to the
version checks), how a saved tensor is recorded (`record`), how a holder hands its tensor to
backward (`take`; `plan.profile` measures a recompute's saved tensors through it), and the
checks of a recomputed tensor (`check_meta`, `check_count`, `replaced_parameter`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .arguments import flatten
from .guards import CheckpointError, Holder, Saved, meta_of, mismatch
from .hidden_inputs import graph_leaves
from .module_state import saw_saved

_CUSTOM_NODE = torch.autograd.function.BackwardCFunction


# --------------------------------------------------------------------------------- forward
@dataclass
class Forward:
    """What a forward returned: the output, flattened, and what its graph reached."""

    out: object
    flat: list                       # the output's leaves (`arguments.flatten`)
    spec: object
    tensors: list                    # the tensors among them
    leaves: list                     # leaf tensors requiring grad that its graph read
    before: list                     # nodes made before it: a captured tensor's history


def run_forward(fn, args, kwargs, inputs, guards, pack, unpack, context) -> Forward:
    """Run ``fn`` with every saved tensor through ``pack``/``unpack``; the parameters it read
    (the leaves its graph reached, those of the modules that ran) join the version checks
    (note 7)."""
    since = torch._C._autograd._get_sequence_nr()
    with guards.state.watching(), torch.autograd.graph.saved_tensors_hooks(pack, unpack), \
            (context or contextlib.nullcontext()), \
            (guards.trace.forward if guards.trace else contextlib.nullcontext()):
        out = fn(*args, **kwargs)
    flat, spec = flatten(out)
    tensors = [o for o in flat if isinstance(o, torch.Tensor)]
    leaves, before = graph_leaves(tensors, since, inputs)
    guards.versions.add(leaves + guards.state.parameters_read())
    return Forward(out, flat, spec, tensors, leaves, before)


def record(saved: list, t: torch.Tensor, digest=None, leaf=None, log=None) -> Holder:
    """A forward's pack: an empty holder for ``t``, with its record appended to ``saved``
    (and noted in ``debug=True``'s log)."""
    h = Holder()
    saved.append(Saved(h, t, digest, leaf))
    saw_saved(t)
    if log is not None:
        log.saved(len(saved) - 1, t)
    return h


def held(t: torch.Tensor) -> Holder:
    """A holder filled with ``t``, as a recompute fills one (`plan.profile` measures that)."""
    h = Holder()
    h.tensor = t
    return h


def take(h: Holder) -> torch.Tensor:
    """A backward's unpack of a filled holder: a built-in node reads its saved tensors once, so
    the holder lets go and the tensor lives only until that node returns (before autograd
    reduces the gradients it sends, e.g. a broadcast bias's); a custom
    ``autograd.Function`` may read ``ctx.saved_tensors`` twice, so its holder keeps it."""
    t = h.tensor
    if not isinstance(torch._C._current_autograd_node(), _CUSTOM_NODE):
        h.tensor = None
    return t


# ------------------------------------------------------------------------------ recompute
def check_meta(what: str, t: torch.Tensor, meta: tuple):
    """Refuse a recomputed tensor whose shape, dtype or device is not the forward's (note 9)."""
    if meta_of(t) != meta:
        raise mismatch(what, meta, meta_of(t))


def check_count(impl: str, what: str, got: int, want: int):
    """Refuse a recompute that saved (or returned) another number of tensors than the forward."""
    if got != want:
        more = "more tensors than the forward did" if got > want else \
            f"{got} tensors but the forward {want}"
        raise CheckpointError(
            f"impl='{impl}': the recompute {what} {more}; the checkpointed function must run "
            "the same operations both times.")


def replaced_parameter(what: str) -> CheckpointError:
    """The refusal when the recompute reads another parameter object than the forward did."""
    return CheckpointError(
        f"{what} a parameter that the recompute reads as another object than the forward "
        "did: was it replaced (m.weight = nn.Parameter(...)) between forward and backward, in "
        "a module ckpt_lab does not see? Replace parameters after backward.")
