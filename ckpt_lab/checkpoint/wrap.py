"""Checkpoint the blocks of any model in place, the way real training code does it.

`checkpoint_sequential` needs a chain of layers; real models (a Hugging Face decoder, an
``nn.TransformerEncoder``, your own) call their blocks from their own ``forward`` with keyword
arguments (attention masks, position embeddings, caches) and get tuples back.
`checkpoint_modules(model, select)` leaves that code alone: it gives every submodule ``select``
matches a ``forward`` that runs the original one under ckpt_lab's `checkpoint`.

* Only ``module.forward`` changes (an instance attribute shadows the class's method, as
  Accelerate's hooks do): a `CheckpointedForward`, a plain object that holds the module, so
  a copy of the model (``deepcopy``, ``AveragedModel``, ``torch.save``) runs its own weights.
  ``nn.Module.__call__`` still runs the module's forward pre-hooks
  and forward hooks once each, outside the checkpoint; parameters, buffers and
  ``state_dict`` keys are untouched. ``remove()`` deletes the attribute (or puts back one that
  was there), which restores the model exactly.
* Tensor arguments, keyword ones included, are passed to `checkpoint` positionally, so they get
  gradients under either implementation; everything else (``None``, flags, cache objects) is
  bound as it is.
* Whatever the block returns (a tensor, a tuple with ``None`` in it) comes back unchanged.
* A block called with ``use_cache=True`` or a key/value cache is refused while grad is on:
  the recompute would write the cache twice and the cache would pin what checkpointing frees.

Which blocks to checkpoint for a budget: `ckpt_lab.plan.module_planner.plan_modules`.
"""
from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field

import torch
from torch import nn

from . import IMPLS, check_options, checkpoint

CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past")


@dataclass
class CheckpointedModules:
    """What `checkpoint_modules` changed: the matched names, and `remove()` to undo it."""

    names: list[str]
    modules: list[nn.Module] = field(repr=False)
    _saved: list = field(repr=False, default_factory=list)

    def remove(self) -> None:
        """Give every matched module back its own forward (idempotent)."""
        for module, had, previous in self._saved:
            if had:
                module.__dict__["forward"] = previous
            else:
                module.__dict__.pop("forward", None)
        self._saved = []

    @property
    def active(self) -> bool:
        """Whether the modules are still checkpointed (`remove` not called yet)."""
        return bool(self._saved)

    def __enter__(self) -> "CheckpointedModules":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _matcher(select):
    """A predicate (name, module) -> bool from a class, a tuple of classes, a list of module
    names or a predicate."""
    if isinstance(select, list):
        if not all(isinstance(n, str) for n in select):
            raise TypeError(f"a list select must hold module names (str), got {select!r}")
        chosen = set(select)
        return lambda name, m: name in chosen
    if isinstance(select, type):
        if not issubclass(select, nn.Module):
            raise TypeError(f"select is the class {select.__name__}, which is not an nn.Module "
                            "subclass; pass a block class such as nn.TransformerEncoderLayer")
        return lambda name, m: isinstance(m, select)
    if isinstance(select, tuple):
        if not select or not all(isinstance(c, type) and issubclass(c, nn.Module)
                                 for c in select):
            raise TypeError(f"a tuple select must hold nn.Module classes, got {select!r}")
        return lambda name, m: isinstance(m, select)
    if callable(select):
        return lambda name, m: bool(select(name, m))
    raise TypeError(f"select must be an nn.Module class, a tuple of classes, a list of module "
                    f"names or a predicate (name, module) -> bool, got {type(select).__name__}")


def matched_modules(model: nn.Module, select) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs of `model` that `select` matches, checked: some (a list of
    names may be empty: a plan that checkpoints nothing), all known, none nested."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    match = _matcher(select)
    found = [(name, m) for name, m in model.named_modules() if match(name, m)]
    if isinstance(select, list):
        unknown = sorted(set(select) - {name for name, _ in found})
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not the name of a submodule of "
                             f"{type(model).__name__}; names come from model.named_modules()")
    elif not found:
        kinds = sorted({type(m).__name__ for _, m in model.named_modules()})
        raise ValueError(f"select matched no submodule of {type(model).__name__}; its module "
                         f"classes are {', '.join(kinds)}. Pass one of them (the repeated "
                         "block) or a predicate on the names in model.named_modules().")
    names = sorted(n for n, _ in found)   # a descendant sorts right after its ancestor
    for outer, inner in zip(names, names[1:]):
        if outer == "" or inner.startswith(outer + "."):
            raise ValueError(
                    f"select matched {outer or '<the model itself>'!r} and {inner!r} inside it; "
                    "checkpointing both would recompute the inner module twice in backward. "
                    "Make select match one level only (e.g. the block class, not its parts).")
    return found


def _refuse_cache(kwargs):
    """A block that writes a key/value cache would write it again when backward recomputes it."""
    cached = [k for k in CACHE_KWARGS if kwargs.get(k) is not None]
    if kwargs.get("use_cache") is True or cached:
        raise ValueError(
            f"a checkpointed block was called with {'use_cache=True' if not cached else cached[0]}: "
            "its key/value cache would keep every layer's keys and values alive (what "
            "checkpointing frees) and the recompute in backward would append them to the cache a "
            "second time. Train with use_cache=False (model(..., use_cache=False) or "
            "model.config.use_cache = False); generation under torch.no_grad() is unaffected.")


class CheckpointedForward:
    """The ``forward`` `checkpoint_modules` installs on a module: runs the module's own forward
    under `checkpoint`. A plain object holding the module, so a copy of the model
    (``copy.deepcopy``, ``AveragedModel``, ``pickle``, ``torch.save``) copies it with the module
    and runs the copy's own weights; the original forward is looked up at call time."""

    def __init__(self, module: nn.Module, previous, options: dict):
        self.module, self.previous, self.options = module, previous, options

    @property
    def __wrapped__(self):
        """The forward it checkpoints (``inspect.signature`` reads the module's own)."""
        if self.previous is not None:
            return self.previous
        return types.MethodType(type(self.module).forward, self.module)

    def __call__(self, *args, **kwargs):
        original = self.__wrapped__
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        _refuse_cache(kwargs)
        # Tensors travel to `checkpoint` positionally (so they get gradients under either
        # design); everything else (None, flags, cache objects) is bound here as it is.
        values = list(args) + list(kwargs.values())
        at = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        run = functools.partial(_bound, original, values, at, len(args), list(kwargs))
        return checkpoint(run, *(values[i] for i in at), **self.options)


def _bound(original, values, at, n, keys, *tensors):
    """``original`` called with the arguments it was given, ``tensors`` in the tensor slots."""
    filled = list(values)
    for i, t in zip(at, tensors):
        filled[i] = t
    return original(*filled[:n], **dict(zip(keys, filled[n:])))


def checkpoint_modules(model: nn.Module, select, impl: str = "hooks", policy=None,
                       preserve_rng_state: bool = True, context_fn=None,
                       determinism_check: str = "default", early_stop: bool = True,
                       debug: bool = False) -> CheckpointedModules:
    """Checkpoint every submodule of `model` that `select` matches; returns a handle to undo it.

    ``select``: an ``nn.Module`` class, a tuple of classes, a list of names from
    ``model.named_modules()`` (``plan.select`` of `plan_modules`; an empty list checkpoints
    nothing), or a predicate ``(name, module) -> bool`` over them. ``impl``, ``policy``,
    ``preserve_rng_state``, ``context_fn``, ``determinism_check``, ``early_stop`` and
    ``debug`` are passed to `checkpoint`. Under ``torch.no_grad()`` the modules run as before.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    check_options(determinism_check, context_fn, policy)
    found = matched_modules(model, select)
    for name, m in found:
        if isinstance(m.__dict__.get("forward"), CheckpointedForward):
            raise ValueError(f"{name or 'the model'} is already checkpointed by an earlier "
                             "checkpoint_modules call; call .remove() on that handle first.")
    options = {"impl": impl, "preserve_rng_state": preserve_rng_state, "policy": policy,
               "context_fn": context_fn, "determinism_check": determinism_check,
               "early_stop": early_stop, "debug": debug}
    handle = CheckpointedModules([n for n, _ in found], [m for _, m in found])
    for _, m in found:
        had = "forward" in m.__dict__
        previous = m.__dict__.get("forward")
        handle._saved.append((m, had, previous))
        m.forward = CheckpointedForward(m, previous if had else None, options)
    return handle
