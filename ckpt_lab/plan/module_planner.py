"""Which blocks of any model to checkpoint so that a step fits a memory budget.

`plan_modules(model, select, step, budget_bytes)` picks which blocks `select` matches (as
`checkpoint_modules` matches them) to checkpoint so that the step's peak fits a budget, on the
exact step model of `recorded_step` (two recorded steps, plain and all checkpointed, predict
the peak of any set); ``plan.select`` is the list of names for `checkpoint_modules`.
`profile_modules` charges the bytes autograd saves to blocks, exactly for any set, after the
forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ..checkpoint.arguments import tensors_in
from ..checkpoint.wrap import checkpoint_modules, matched_modules
from ..measure.memory import StorageBirths
from .recorded_step import ModulePlan, ModuleStep, SameStart, record_step


@dataclass
class BlockProfile:
    """One matched block in one step: bytes it first saved for backward, output bytes, time."""

    name: str
    act_bytes: int
    out_bytes: int
    forward_seconds: float


@dataclass
class ModuleProfile:
    """The matched blocks of one step, in call order, and what sits outside them.

    ``input_bytes``: the first block's input. ``other_saved_bytes``: saved for backward outside
    every block (embeddings, head, loss, and the blocks' shared arguments).
    ``shared_args_bytes``: tensor arguments after the first (masks, position ids) that nothing
    saves, yet a checkpoint keeps alive as inputs of its recompute.
    """

    blocks: list[BlockProfile]
    input_bytes: int
    other_saved_bytes: int
    shared_args_bytes: int
    # per storage saved for backward: (bytes, the blocks that save it, None for outside them)
    saved: dict[int, tuple[int, frozenset]] = field(default_factory=dict, repr=False)
    # per block: the storages of its tensor arguments; the bytes of those the step allocated
    args: dict[str, frozenset] = field(default_factory=dict, repr=False)
    arg_bytes: dict[int, int] = field(default_factory=dict, repr=False)

    def checkpoint_saving_bytes(self, names) -> int:
        """Bytes alive after the forward that checkpointing the named blocks frees (exact).

        A storage the step allocated is freed when every block that saves it is checkpointed
        and no checkpoint keeps it as an input; an argument nothing saved costs its bytes when
        a checkpoint keeps it. So a block's output that the next block saves too is not freed
        by checkpointing the block alone, and the model's input, which the caller holds,
        neither counts nor costs.
        """
        chosen = set(names) & {b.name for b in self.blocks}
        if not chosen:
            return 0
        kept = frozenset().union(*(self.args.get(n, frozenset()) for n in chosen))
        freed = sum(nbytes for key, (nbytes, savers) in self.saved.items()
                    if savers <= chosen and key not in kept)
        pinned = sum(self.arg_bytes.get(key, 0) for key in kept if key not in self.saved)
        return freed - pinned


def profile_modules(model: nn.Module, select, step) -> ModuleProfile:
    """Run ``step()`` (a forward, or forward and backward) once and profile the matched blocks.

    Every storage autograd saves is charged to the block that saved it first (parameters and
    buffers are not activations and are skipped, passed as arguments or not); a block's other
    tensor arguments after the first (attention masks, position embeddings) are shared and
    charged outside every block.
    Profile a model that is not checkpointed: a checkpoint hides what it saves.
    """
    found = matched_modules(model, select)
    weights = {id(t.untyped_storage()) for t in list(model.parameters()) + list(model.buffers())}
    owner: dict[int, tuple[object, int]] = {}
    shared: dict[int, torch.UntypedStorage] = {}
    state = {"block": None, "start": 0.0}
    stats: dict[str, dict] = {}
    order: list[str] = []

    savers: dict[int, set] = {}                # storage -> the blocks that save it
    block_args: dict[str, set] = {}
    arg_storages: dict[int, torch.UntypedStorage] = {}   # alive until the profile is built
    allocated = StorageBirths()

    def pack(t):
        st = t.untyped_storage()
        key = id(st)
        if key not in weights:
            owner.setdefault(key, (state["block"], st.nbytes(), st))
            savers.setdefault(key, set()).add(state["block"])
        return t

    def pre(name):
        def hook(module, args, kwargs):
            # tensors besides the first (masks, position embeddings) are shared by every
            # block and kept whether or not the block is checkpointed: not the block's own
            # (a parameter or buffer passed along is no activation at all)
            tensors = tensors_in((args, kwargs))
            for i, t in enumerate(tensors):
                st = t.untyped_storage()
                if id(st) in weights:
                    continue
                block_args.setdefault(name, set()).add(id(st))
                arg_storages[id(st)] = st
                if i > 0:
                    owner.setdefault(id(st), (None, st.nbytes(), st))
                    shared.setdefault(id(st), st)
            if name not in stats:
                first = tensors[0] if tensors else None
                stats[name] = {"in": first.untyped_storage().nbytes() if first is not None
                               else 0, "out": 0, "seconds": 0.0}
                order.append(name)
            state["block"], state["start"] = name, time.perf_counter()
        return hook

    def post(name):
        def hook(module, args, kwargs, out):
            stats[name]["seconds"] += time.perf_counter() - state["start"]
            outs = tensors_in(out)
            stats[name]["out"] = outs[0].untyped_storage().nbytes() if outs else 0
            state["block"] = None
        return hook

    handles = []
    try:
        for name, m in found:
            handles.append(m.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(m.register_forward_hook(post(name), with_kwargs=True))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), allocated:
            step()
    finally:
        for h in handles:
            h.remove()
    if not order:
        raise ValueError("step() never called the matched blocks; pass a function that runs "
                         "the model's forward")
    act = {name: 0 for name in order}
    other = 0
    for block, nbytes, _ in owner.values():
        if block is None:
            other += nbytes
        else:
            act[block] += nbytes
    blocks = [BlockProfile(n, act[n], stats[n]["out"], stats[n]["seconds"]) for n in order]
    unsaved = sum(st.nbytes() for k, st in shared.items() if k not in savers)
    # The exact saving counts only what the step allocated: a tensor the caller holds (the
    # model's input) stays alive whatever is checkpointed.
    saved = {key: (owner[key][1], frozenset(who)) for key, who in savers.items()
             if allocated.created(owner[key][2])}
    arg_bytes = {key: st.nbytes() for key, st in arg_storages.items() if allocated.created(st)}
    return ModuleProfile(blocks, stats[order[0]]["in"], other - unsaved, unsaved, saved,
                         {n: frozenset(k) for n, k in block_args.items()}, arg_bytes)


def profile_module_step(model: nn.Module, select, step) -> ModuleStep:
    """Record ``step()`` twice, plain and with every matched block checkpointed: the exact step
    model of `recorded_step`, which predicts the step's peak for any set of checkpointed blocks.

    ``step()`` runs one training step's forward and backward, or returns the loss (a scalar
    tensor, or an output with ``.loss``), whose ``.backward()`` is then called. Both runs start
    from the model as it is (parameter gradients, buffers, random generators), which is left so.
    """
    found = matched_modules(model, select)
    if not found:
        raise ValueError("select matched no block; pass the block class or the names of blocks")
    weights = {id(t.untyped_storage()) for t in list(model.parameters()) + list(model.buffers())}
    records = []
    with SameStart(model) as start:
        for checkpointed in (False, True):
            start.reset()
            handle = checkpoint_modules(model, [n for n, _ in found]) if checkpointed else None
            try:
                records.append(record_step(found, step, weights))
            finally:
                if handle is not None:
                    handle.remove()
    return ModuleStep([n for n, _ in found], *records,
                      classes=[type(m).__qualname__ for _, m in found])


def plan_modules(model: nn.Module, select, step, budget_bytes) -> ModulePlan:
    """The matched blocks to checkpoint so that the step's peak fits ``budget_bytes``, with the
    least recomputed forward time (of those, the least peak).

    The budget and ``plan.peak_bytes`` mean what `planner.plan_chain`'s do: the peak of the
    step as `track_memory` measures ``step()`` and its backward (see `profile_module_step`),
    from the state the model is in now (parameter gradients that are None get allocated in the
    step and count). ``plan.peak_bytes`` is the prediction of the exact step model; a plan may
    checkpoint no block (``plan.names == []``). Apply it with
    ``checkpoint_modules(model, plan.select)``. Raises `planner.BudgetTooSmallError` naming the
    least peak any set of blocks reaches.
    """
    return profile_module_step(model, select, step).plan(budget_bytes)
