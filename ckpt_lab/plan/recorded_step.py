"""The step model of `checkpoint_modules`: the peak of a training step for any set of
checkpointed blocks, from two measured steps, and the cheapest set that fits a budget.

`record_step` runs the caller's step once under `track_memory` with markers: one plain step
(P) and one with every matched block checkpointed (C). The markers cut both into the same
pieces, in the order a step runs them: the code before the first block; each block's forward
and the code after it up to the next block (after the last: the head, the loss and the head's
backward); then each block's backward, from the moment its output's gradient arrives until the
next block's does (the first block's: to the end of the step). A step that checkpoints a set S
of blocks runs these pieces in this order, block j's taken from C if j is in S and from P
otherwise (the pieces between blocks are the same in both, which is checked). Its live bytes
are then the sum of two parts:

* each piece's own rise and fall, starting from what the pieces before it left behind (a plain
  block's forward leaves what it saved; a checkpointed one leaves almost nothing, and its
  backward recomputes first);
* the tensors that pass between blocks (their arguments and outputs: hidden states, masks,
  position embeddings), which live from their birth until the last of their holders lets go: a
  plain block that saved it (when P measured that block's backward release it), a checkpointed
  block that takes it as an argument (a checkpoint keeps its inputs, tensors nested in its
  arguments too, until it goes in its backward, which C measured as the moment that block's own
  input goes), code outside the blocks that saved it or, when nothing holds it, the moment the
  model's code drops it. Which holders there are depends on S, so these are counted apart.

`ModuleStep.peak_bytes(names)` concatenates the pieces; `ModuleStep.plan(budget)` finds the
set of least recompute (forward seconds of the checkpointed blocks, measured in P) whose peak
fits, by a dynamic programme over the blocks in call order: a piece's peak depends on the
choices before it only through the bytes the earlier forwards left (one number) and which
passing tensors already have a holder, because what a block leaves after its own backward is
the same checkpointed or not (checked; where it is not, the programme counts the larger, so
its plans still fit, and `peak_bytes` still concatenates). The prediction is byte-exact for
every set of blocks of the course's GPT, two ``nn.TransformerEncoder`` and two Hugging Face
models (tests/plan/test_plan_modules.py), and the programme agrees with a search over every set.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..checkpoint.arguments import tensors_in
from ..measure.memory import new_storages, track_memory
from .budget import BudgetTooSmallError, budget_bytes_of, least_budget_where


_LIFT_FRESH = torch.ops.aten.lift_fresh.default


class _Events(TorchDispatchMode):
    """Every op and every marker as an event with the live bytes after it (read from the
    `track_memory` log beneath); each storage an op creates, with its birth and death events."""

    def __init__(self, log):
        super().__init__()
        self.log = log
        self.live: list[int] = []
        self.serial: dict[int, int] = {}     # id(storage) -> serial, while it lives
        self.born: list[tuple[int, int]] = []   # serial -> (event, bytes)
        self.died: dict[int, int] = {}
        self.watches: list[weakref.finalize] = []

    def mark(self) -> int:
        """An event that is no op (a block starting, a gradient arriving); returns its index."""
        self.live.append(self.log.current_bytes)
        return len(self.live) - 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        here = self.mark()
        made = tensors_in(out) if func is _LIFT_FRESH else None   # torch.tensor(data), as
        made = [t.untyped_storage() for t in made] if made is not None \
            else new_storages(func, args, kwargs, out)          # track_memory counts it
        for st in made:
            if st.nbytes() > 0 and id(st) not in self.serial:
                self.serial[id(st)] = n = len(self.born)
                self.born.append((here, st.nbytes()))
                self.watch(st, self._died, id(st), n)
        return out

    def watch(self, obj, *callback):
        """Call back when `obj` is freed (while this step is recorded)."""
        self.watches.append(weakref.finalize(obj, *callback))

    def stop(self):
        """Stop watching: what outlives the step counts as alive at its end."""
        for w in self.watches:
            w.detach()
        self.watches.clear()

    def _died(self, key: int, n: int):
        self.died[n] = len(self.live)
        if self.serial.get(key) == n:
            del self.serial[key]

    def of(self, t: torch.Tensor):
        """The serial of a tensor's storage if the step created it, else None."""
        return self.serial.get(id(t.untyped_storage()))


@dataclass
class StepRecord:
    """One measured step: live bytes per event, block markers, and the tensors passing between
    blocks (keyed by where they first appear: ("arg", block, position) or ("out", block))."""

    live: np.ndarray
    start: list          # per block: the event its forward starts at
    end: list            # per block: the event its forward ends at
    grad: list           # per block: the event its output's gradient arrived at (None: never)
    seconds: list        # per block: forward seconds
    size: dict = field(default_factory=dict)
    born: dict = field(default_factory=dict)
    died: dict = field(default_factory=dict)     # None: alive at the end
    saved: dict = field(default_factory=dict)    # key -> [(block or None, release event)]
    args: list = field(default_factory=list)     # per block: keys of its tensor arguments
    first_arg: list = field(default_factory=list)
    shapes: list = field(default_factory=list)   # per block: shapes and dtypes of its arguments


def run_step(step) -> None:
    """One training step: ``step()``, which runs the forward and backward itself or returns the
    loss (a scalar tensor, or an output holding it in ``.loss``, as Hugging Face models do);
    then only the loss is kept, and its ``.backward()`` called."""
    out = step()
    loss = out if isinstance(out, torch.Tensor) else getattr(out, "loss", None)
    del out
    if isinstance(loss, torch.Tensor) and loss.requires_grad and loss.grad_fn is not None:
        if loss.numel() != 1:
            raise ValueError(f"step() returned a tensor of shape {tuple(loss.shape)}, not a scalar "
                             "loss: return the loss, or call backward inside step()")
        loss.backward()


def record_step(found, step, weights) -> StepRecord:
    """Run one step (`run_step`) with markers on the matched blocks `found` [(name, module)]."""
    index = {id(m): i for i, (_, m) in enumerate(found)}
    m = len(found)
    start, end, grad, seconds = [None] * m, [None] * m, [None] * m, [0.0] * m
    first_arg, arg_keys, shapes = [None] * m, [[] for _ in range(m)], [None] * m
    key_of: dict[int, tuple] = {}
    packs = []
    state = {"block": None, "t": 0.0}
    with track_memory() as log:
        events = _Events(log)

        def name(serial, key):
            if serial is not None:
                key_of.setdefault(serial, key)
            return key_of.get(serial)

        def pre(module, args, kwargs):
            k = index[id(module)]
            if start[k] is not None:
                raise ValueError(f"block {found[k][0]} ran twice in one step; checkpoint_modules "
                                 "plans blocks that run once per step")
            start[k] = events.mark()
            tensors = [t for t in tensors_in((args, kwargs))
                       if id(t.untyped_storage()) not in weights]
            shapes[k] = tuple((tuple(t.shape), t.dtype) for t in tensors)
            for p, t in enumerate(tensors):
                key = name(events.of(t), ("arg", k, p))
                if key is not None:
                    arg_keys[k].append(key)
                if p == 0:
                    first_arg[k] = key
            state["block"], state["t"] = k, time.perf_counter()

        def post(module, args, kwargs, out):
            k = index[id(module)]
            seconds[k] = time.perf_counter() - state["t"]
            end[k] = events.mark()
            state["block"] = None
            tensors = tensors_in(out)
            if tensors:
                name(events.of(tensors[0]), ("out", k))
                if tensors[0].requires_grad:
                    tensors[0].register_hook(lambda g, k=k: grad.__setitem__(k, events.mark()))

        def pack(t):
            alias, slot = t.detach(), [None]   # the alias goes when autograd lets go of it
            packs.append((events.of(t), state["block"], slot))
            events.watch(alias, lambda: slot.__setitem__(0, len(events.live)))
            return alias

        handles = []
        try:
            for _, module in found:
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                handles.append(module.register_forward_hook(post, with_kwargs=True))
            with events, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                events.mark()
                run_step(step)
                events.mark()
        finally:
            events.stop()
            for h in handles:
                h.remove()
    keys = {key: s for s, key in key_of.items()}
    saved = {key: [] for key in keys}
    for serial, block, slot in packs:
        if serial in key_of:
            saved[key_of[serial]].append((block, slot[0]))
    return StepRecord(np.array(events.live, dtype=np.int64), start, end, grad, seconds,
                      {k: events.born[s][1] for k, s in keys.items()},
                      {k: events.born[s][0] for k, s in keys.items()},
                      {k: events.died.get(s) for k, s in keys.items()}, saved, arg_keys,
                      first_arg, shapes)


class SameStart:
    """Runs several steps from the model's state as it is: `reset()` before each puts back the
    parameter gradients (copies: a step accumulates into them), the buffers (BatchNorm
    statistics) and the random generators; leaving restores them all."""

    def __init__(self, model: torch.nn.Module):
        self.params = [p for p in model.parameters()]
        self.buffers = list(model.buffers())

    def __enter__(self):
        self.grads = [p.grad for p in self.params]
        self.saved = [b.detach().clone() for b in self.buffers]
        cuda = sorted({p.device.index or 0 for p in self.params if p.device.type == "cuda"})
        self.rng = torch.random.fork_rng(devices=cuda)
        self.rng.__enter__()
        self.cpu = torch.get_rng_state()
        self.cuda = {d: torch.cuda.get_rng_state(d) for d in cuda}
        return self

    def reset(self):
        """The state the caller had, again."""
        for p, g in zip(self.params, self.grads):
            p.grad = None if g is None else g.clone()
        with torch.no_grad():
            for b, saved in zip(self.buffers, self.saved):
                b.copy_(saved)
        torch.set_rng_state(self.cpu)
        for d, state in self.cuda.items():
            torch.cuda.set_rng_state(state, d)

    def __exit__(self, *exc):
        self.reset()
        for p, g in zip(self.params, self.grads):
            p.grad = g
        self.rng.__exit__(*exc)
        return False


@dataclass
class ModulePlan:
    """Which matched blocks to checkpoint: ``names`` (in call order), the predicted peak of the
    step with them checkpointed, and the recomputed forward seconds."""

    names: list[str]
    peak_bytes: int
    recompute_seconds: float
    budget_bytes: int | None
    step: "ModuleStep" = field(repr=False)

    @property
    def select(self) -> list[str]:
        """What to pass to `checkpoint_modules`: the names this plan checkpoints (maybe none)."""
        return list(self.names)


class ModuleStep:
    """Two recorded steps (plain, every block checkpointed) and what they predict."""

    def __init__(self, names, plain: StepRecord, ckpt: StepRecord, classes=None):
        m = len(names)
        order = sorted(range(m), key=lambda k: plain.start[k])
        for rec, what in ((plain, "plain"), (ckpt, "checkpointed")):
            missing = [names[k] for k in range(m) if rec.grad[k] is None]
            if missing:
                raise ValueError(f"no gradient reached the output of {missing[0]} in the {what} "
                                 "step: step() must run the backward (or return the loss), and "
                                 "the matched blocks' outputs must require grad")
            if sorted(range(m), key=lambda k: rec.start[k]) != order or \
                    sorted(range(m), key=lambda k: -rec.grad[k]) != order:
                raise ValueError("the matched blocks do not run one after another, forward and "
                                 "then backward in reverse; plan_modules needs a chain of blocks")
        if sorted(plain.size.items()) != sorted(ckpt.size.items()):
            raise ValueError("the checkpointed step passes other tensors between the blocks than "
                             "the plain one; is the step deterministic?")
        self.names = [names[k] for k in order]
        self.m, self.runs = m, (plain, ckpt)
        # recompute cost: measured forward seconds, one figure for blocks of a class that run
        # as many ops on arguments of the same shapes (their mean), so timing noise picks no
        # block
        classes = [classes[k] if classes else "" for k in order]
        sig = [(classes[j], plain.end[k] - plain.start[k], plain.shapes[k])
               for j, k in enumerate(order)]
        groups = {}
        for j, k in enumerate(order):
            groups.setdefault(sig[j], []).append(plain.seconds[k])
        self.seconds = [sum(groups[sig[j]]) / len(groups[sig[j]]) for j in range(m)]
        self.plain_peak_bytes = int(plain.live.max())
        self.keys = sorted(plain.size)
        # every run in the same block numbering: call order
        pos = {k: j for j, k in enumerate(order)}
        self._recs = [_Renumbered(rec, order, pos) for rec in self.runs]
        self._pieces()
        self._explicit()

    # ------------------------------------------------------------------ pieces
    def _pieces(self):
        """Piece n in step order: ("pre"|"F"|"G"|"B", block); per run its event range and its
        live bytes with the passing tensors taken out ("clean"), relative to its start."""
        m = self.m
        self.kinds = [("pre", None)] + [(k, j) for j in range(m) for k in ("F", "G")] + \
            [("B", j) for j in reversed(range(m))]
        self.ranges, self.local, self.delta = [], [], []
        for rec in self._recs:
            r = rec.rec
            b = [rec.start[0]]
            for j in range(m):
                b += [rec.end[j], rec.start[j + 1] if j + 1 < m else rec.grad[m - 1]]
            b += [rec.grad[j] for j in reversed(range(m - 1))] + [len(r.live)]
            ranges = list(zip([0] + b[:-1], b))
            clean = r.live.copy()
            for key in self.keys:
                died = r.died[key] if r.died[key] is not None else len(clean)
                clean[r.born[key]:died] -= r.size[key]
            self.ranges.append(ranges)
            self.local.append([clean[s:e] - clean[s] for s, e in ranges])
            self.delta.append([int(clean[e] - clean[s]) if e < len(clean) else 0
                               for s, e in ranges])
        for n, (kind, _) in enumerate(self.kinds):
            if kind in ("pre", "G") and not (
                    self.delta[0][n] == self.delta[1][n]
                    and np.array_equal(self.local[0][n], self.local[1][n])):
                raise ValueError("the code between the matched blocks allocates differently when "
                                 "they are checkpointed; plan_modules cannot predict this step")
        self.piece_of = {(kind, j): n for n, (kind, j) in enumerate(self.kinds)}
        fwd = lambda j, v: self.delta[v][self.piece_of["F", j]]  # noqa: E731
        bwd = lambda j, v: self.delta[v][self.piece_of["B", j]]  # noqa: E731
        # what block j leaves after its backward, checkpointed or not (the larger if they differ)
        self.net = [max(fwd(j, v) + bwd(j, v) for v in (0, 1)) for j in range(self.m)]
        self.exact_net = all(fwd(j, 0) + bwd(j, 0) == fwd(j, 1) + bwd(j, 1)
                             for j in range(1, self.m))

    def _where(self, v: int, event):
        """(piece, offset) of run v's event; None: after the end."""
        if event is None:
            return None
        for n, (s, e) in enumerate(self.ranges[v]):
            if s <= event < e:
                return n, event - s
        return None

    def _explicit(self):
        """Per passing tensor: bytes, birth, holders' releases, and when the code drops it."""
        self.info = {}
        for key in self.keys:
            P, C = (rec.rec for rec in self._recs)
            info = {"size": P.size[key],
                    "born": [self._where(v, self._recs[v].rec.born[key]) for v in (0, 1)],
                    # plain blocks that save it: released in their backward, as P measured
                    "saves": {}, "outside": [[], []], "args": [], "natural": None}
            for v in (0, 1):
                for block, release in self._recs[v].saved[key]:
                    where = self._where(v, release)
                    if block is None:
                        info["outside"][v].append(where)
                    elif v == 0:
                        info["saves"].setdefault(block, []).append(where)
            # checkpointed blocks that take it: kept until the checkpoint goes, which is when
            # that block's own input (held by nothing else in C) goes
            for j in range(self.m):
                if key in self._recs[1].args[j]:
                    first = self._recs[1].first_arg[j]
                    where = self._where(1, C.died[first]) if first is not None else None
                    n = self.piece_of["B", j]
                    if where is None or where[0] != n:
                        where = (n, len(self.local[1][n]))
                    info["args"].append((j, where))
            # nothing holds it: it goes when the model's code drops it (seen where nothing held it)
            for v in (0, 1):
                held = self._recs[v].saved[key] or (v == 1 and info["args"])
                if not held:
                    info["natural"] = (v, self._where(v, self._recs[v].rec.died[key]))
                    break
            self.info[key] = info
        self.backward_start = self.piece_of["B", self.m - 1]
        # for the programme: what block j holds as v, which tensors a later block may hold
        self._holding = [[self._holds(j, v) for v in (0, 1)] for j in range(self.m)]
        self._future = [frozenset(key for key, info in self.info.items()
                                  if any(b > j for b in info["saves"])
                                  or any(b > j for b, _ in info["args"])) for j in range(self.m)]
        self._none, self._memo = {}, {}

    # ------------------------------------------------------------------ exact prediction
    def _variants(self, chosen) -> list[int]:
        return [1 if kind in ("F", "B") and j in chosen else 0 for kind, j in self.kinds]

    def _holders(self, key, chosen, variant):
        """The release positions (piece, offset) of a tensor's holders when `chosen` are
        checkpointed; None marks one that outlives the step."""
        info, out = self.info[key], []
        for j, wheres in info["saves"].items():
            if j not in chosen:
                out += wheres
        for j, where in info["args"]:
            if j in chosen:
                out.append(where)
        for v in (0, 1):
            for where in info["outside"][v]:
                if where is None or variant[where[0]] == v \
                        or self.kinds[where[0]][0] in ("pre", "G"):
                    out.append(where)
        return out

    def _natural(self, key, variant):
        """When the model's code drops the tensor, where a run saw that (nothing held it
        there): None if no run did. A position in a piece S runs from the other run: its end."""
        nat = self.info[key]["natural"]
        if nat is None:
            return None
        v, where = nat
        if where is None:
            return _END
        n, _ = where
        if self.kinds[n][0] in ("F", "B") and variant[n] != v:
            return (n, len(self.local[variant[n]][n]))
        return where

    def peak_bytes(self, names) -> int:
        """Predicted peak of the step with the named blocks checkpointed (names not matched
        raise); as `track_memory` measures ``step()`` and its backward."""
        return int(self.timeline(names).max())

    def timeline(self, names) -> np.ndarray:
        """Predicted live bytes after every event of the step with `names` checkpointed."""
        unknown = sorted(set(names) - set(self.names))
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of the matched blocks {self.names}")
        chosen = {self.names.index(n) for n in names}
        variant = self._variants(chosen)
        offsets, parts, total, base = [], [], 0, 0
        for n, v in enumerate(variant):
            parts.append(base + self.local[v][n])
            base += self.delta[v][n]
            offsets.append(total)
            total += len(self.local[v][n])
        live = np.concatenate(parts)
        diff = np.zeros(total + 1, dtype=np.int64)

        def at(where):
            return total if where in (None, _END) else offsets[where[0]] + where[1]

        for key in self.keys:
            n = self.info[key]["born"][0][0]
            born = at(self.info[key]["born"][variant[n]])
            # alive until the last holder lets go, and at least until the code drops it (if
            # no run saw that and nothing holds it: until the backward starts)
            ends = self._holders(key, chosen, variant)
            nat = self._natural(key, variant)
            ends += [nat] if nat is not None else [] if ends else [(self.backward_start, 0)]
            died = max(at(w) for w in ends)
            if died > born:
                diff[born] += self.info[key]["size"]
                diff[died] -= self.info[key]["size"]
        return live + np.cumsum(diff)[:total]

    # ------------------------------------------------------------------ the plan
    def _alive_in(self, n, v, key, held_before, held_after, own):
        """Per event of piece n (run v), whether the tensor is alive (None: at none), as
        `timeline` counts it. `held_before`: a block before this piece's holds it (releasing
        after this piece); `held_after`: in a forward piece, some block holds it or may still
        (every release comes later); `own`: this piece's block holds it, releasing there."""
        info, length = self.info[key], len(self.local[v][n])
        idx = np.arange(length)
        bn, bo = info["born"][v]
        if bn > n:
            return None
        alive = idx >= bo if bn == n else np.ones(length, dtype=bool)
        if held_before or (held_after and self.kinds[n][0] != "B"):
            return alive
        ends = list(own) + list(info["outside"][v])
        nat = self._natural(key, [v] * len(self.kinds))
        if nat is not None:
            ends.append(nat)
        elif not ends and not held_after:
            ends.append((self.backward_start, 0))
        keep = np.zeros(length, dtype=bool)
        for where in ends:
            if where is None or where is _END or where[0] > n:
                return alive
            if where[0] == n:
                keep |= idx < where[1]
        return alive & keep if keep.any() else None

    def _piece_peak(self, n, v, held_before, held_after, own) -> int:
        """Most live bytes in piece n of run v above its base, passing tensors included."""
        live = self.local[v][n].copy()
        for key in self.keys:
            a = self._alive_in(n, v, key, key in held_before, key in held_after, own.get(key, ()))
            if a is not None:
                live[a] += self.info[key]["size"]
        return int(live.max()) if len(live) else 0

    def _holds(self, j, v) -> dict:
        """The passing tensors block j holds when run as v, with their release positions."""
        out = {}
        for key, info in self.info.items():
            if v == 0 and j in info["saves"]:
                out[key] = info["saves"][j]
            if v == 1:
                out.update({key: [w] for b, w in info["args"] if b == j})
        return out

    def _cheapest(self, budget: int):
        """(recompute seconds, chosen set) of the cheapest set whose peak fits, or None."""
        m, piece = self.m, self.piece_of
        memo = self._memo

        def peak(n, v, before, after, own):
            k = (n, v, before, after, id(own))
            if k not in memo:
                memo[k] = self._piece_peak(n, v, before, after, own)
            return memo[k]

        fixed = lambda n: self.delta[0][n]  # noqa: E731
        empty = frozenset()
        if peak(0, 0, empty, frozenset(self.keys), {}) > budget:
            return None
        # states: held passing tensors -> Pareto list of (seconds, bytes left by forwards, chosen)
        states = {frozenset(): [(0.0, 0, ())]}
        base_f, base_b = fixed(0), fixed(0) + sum(fixed(piece["G", j]) for j in range(m))
        for j in range(m):
            after_b = base_b + sum(self.net[i] for i in range(j + 1, m))
            nxt = {}
            for held, entries in states.items():
                for v in (0, 1):
                    holds = self._holding[j][v]
                    held2 = held | frozenset(holds)
                    ahead = held2 | self._future[j]   # forward pieces: later holders count
                    for cost, left, chosen in entries:
                        f = base_f + left
                        if f + peak(piece["F", j], v, held, ahead, self._none) > budget:
                            continue
                        f2 = f + self.delta[v][piece["F", j]]
                        if f2 + peak(piece["G", j], 0, held2, ahead, self._none) > budget:
                            continue
                        b = after_b + left + self.delta[v][piece["F", j]]
                        if b + peak(piece["B", j], v, held, held2, holds) > budget:
                            continue
                        nxt.setdefault(held2, []).append(
                            (cost + (self.seconds[j] if v else 0.0),
                             left + self.delta[v][piece["F", j]],
                             chosen + ((j,) if v else ())))
            states = {h: _pareto(e) for h, e in nxt.items()}
            base_f += fixed(piece["G", j])
        best = [e for entries in states.values() for e in entries]
        if not best:
            return None
        cost, _, chosen = min(best, key=lambda e: (e[0], len(e[2]), e[2]))
        return cost, set(chosen)

    def minimum_bytes(self) -> int:
        """The least step peak any set of checkpointed blocks reaches (by bisection)."""
        return least_budget_where(-1, min(self.plain_peak_bytes, self.peak_bytes(self.names)),
                                  lambda budget: self._cheapest(budget) is not None)

    def plan(self, budget_bytes) -> ModulePlan:
        """The set of least recompute whose predicted step peak fits `budget_bytes` (of those,
        the least peak). Raises BudgetTooSmallError naming the least peak any set reaches."""
        budget = None if budget_bytes is None else budget_bytes_of(budget_bytes)
        budget = self.plain_peak_bytes if budget is None else budget
        found = self._cheapest(budget)
        if found is None:
            raise BudgetTooSmallError(budget, self.minimum_bytes())
        cost, chosen = found
        # the least peak at that cost: the least budget where a set that cheap still fits,
        # and the set found there (the last one that held)
        def holds(budget):
            nonlocal chosen
            f = self._cheapest(budget)
            if f is None or f[0] > cost:
                return False
            chosen = f[1]
            return True
        least_budget_where(0, self.peak_bytes([self.names[j] for j in chosen]), holds)
        names = [self.names[j] for j in sorted(chosen)]
        return ModulePlan(names, self.peak_bytes(names), sum(self.seconds[j] for j in chosen),
                          budget_bytes, self)


def _pareto(entries):
    """Entries not beaten on both seconds and bytes left (ties: the first)."""
    out = []
    for e in sorted(entries, key=lambda e: (e[0], e[1], len(e[2]))):
        if not out or e[1] < out[-1][1]:
            out.append(e)
    return out


_END = (1 << 62, 0)   # a position after the step: the tensor outlives it


class _Renumbered:
    """A StepRecord seen with blocks numbered in call order."""

    def __init__(self, rec: StepRecord, order, pos):
        self.rec = rec
        self.start = [rec.start[k] for k in order]
        self.end = [rec.end[k] for k in order]
        self.grad = [rec.grad[k] for k in order]
        self.first_arg = [rec.first_arg[k] for k in order]
        self.args = [rec.args[k] for k in order]
        self.saved = {key: [(None if b is None else pos[b], r) for b, r in holders]
                      for key, holders in rec.saved.items()}
