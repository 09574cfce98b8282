"""Profile a chain layer by layer: everything a training step's peak memory depends on.

A step of `checkpoint_sequential(layers, x, boundaries=...)` followed by
`.float().sum().backward()` is a sequence of layer forwards, recomputes and backwards. Its
live bytes at any moment are a sum of pieces that belong to single layers: what a layer
saves for backward, the input it holds during its forward, the gradient arriving at it and
what its backward allocates. `profile_layers` measures those pieces for each layer *alone*,
with `track_memory`, in exactly the situations the step puts it in, on a replica of the input
the step hands it (the previous layer's actual output: same strides, storage offset and
storage size, so a ``Linear`` fed a slice makes and saves the copy it makes in the step, and a
layer that writes its input in place writes the replica, never the caller's tensor):

* its forward saving for backward (plain run, or the recompute of a checkpointed segment,
  which stops right after the last tensor it must save), and its forward under a checkpoint,
  which saves nothing;
* its backward, with the gradient arriving at its output as the layer after it sends it (the
  loss's own gradient for the last layer), its input held elsewhere (kept by a checkpoint, or
  saved by the layer before) or, read off the same run by when that input's storage is
  freed, held only by what the layer saved itself;
* once more as a checkpoint's recompute: a layer may save more then
  (`models.RecomputeSafeBatchNorm2d`), and autograd lets go of what a recompute saved as soon
  as the node that reads it returns, before it reduces the gradients it sends (a broadcast
  bias's), where it keeps what a plain forward saved until after.

It also records whether a layer writes its input in place (``nn.ReLU(inplace=True)``): no
checkpointed segment may start there, since its checkpoint keeps that input to run again.
And it measures what ``ckpt_lab.checkpoint``'s replay of module state (`module_state`) costs
around the layer, checkpointed alone: the copies of its persistent buffers at a checkpointed
forward's entry, those kept after it (buffers the forward changed), and the fresh copies a
recompute runs on, of which those it saves stay until the layer's backward (the recompute
measurement above runs on them, as the step's does). Any module's buffers: nothing is
derived from a layer's type.

With ``allocator=True`` the same pieces are read in the allocator's bytes
(`track_memory(allocator=True)`): an operation's temporaries count in every peak, and two
pieces are added that only the allocator sees, what autograd keeps past the saved-tensor
hooks (so a checkpoint cannot drop it) and the generator states a checkpoint keeps.

`step_model` puts the pieces together for any segmentation. Nothing of the
model changes: parameter gradients (`.grad`), buffers (BatchNorm running statistics, the very
objects and their values) and the random number generators are restored afterwards.
"""
from __future__ import annotations

import numbers
import time
import weakref
from dataclasses import dataclass

import torch

from ..measure.memory import phase, track_memory
from ..checkpoint.module_state import ModuleState, saw_saved
from ..checkpoint.recording import held, take


@dataclass
class LayerProfile:
    """What one layer of a chain costs. Bytes count storages allocated by the layer (views once).

    The first four fields are the activation model of lessons 3 and 6; the rest feed the
    exact step model (`planner.step_peak_bytes`) and are None in a hand-made profile. With
    ``allocator=True`` every byte figure is the allocator's (see `profile_layers`).
    """

    name: str
    act_bytes: int                 # storages this layer is the first to save for backward
    out_bytes: int                 # its output
    forward_seconds: float         # median forward time with grad enabled
    work_bytes: int | None = None  # backward's peak beyond its saved tensors: the gradient
    #                                arriving, the one sent on, temporaries
    own_bytes: int | None = None   # saved storages it creates itself (its output if saved)
    saves_input: bool | None = None
    saves_output: bool | None = None
    saves_any: bool | None = None  # saves any tensor at all (parameters count): a recompute runs it
    forward_peak_bytes: int | None = None       # peak in its forward, saving (input not counted)
    free_forward_peak_bytes: int | None = None  # peak in its forward under a checkpoint
    backward_peak_bytes: int | None = None      # peak in its backward, input held elsewhere
    held_backward_peak_bytes: int | None = None  # same, input held only by what it saved
    grad_in_bytes: int | None = None            # the gradient arriving at its output
    # the same when its forward is a checkpoint's recompute (a layer may save more then, e.g.
    # models.RecomputeSafeBatchNorm2d saves copies of its running statistics)
    recompute_own_bytes: int | None = None
    recompute_forward_peak_bytes: int | None = None
    recompute_peak_bytes: int | None = None     # peak up to its last save, where a recompute stops
    recompute_backward_peak_bytes: int | None = None
    recompute_held_backward_peak_bytes: int | None = None
    output_is_view: bool | None = None  # returns its input's storage (nn.Flatten of a contiguous
    #                                     input, nn.ReLU(inplace=True)): makes no new storage
    writes_input: bool | None = None    # writes its input in place (nn.ReLU(inplace=True)): no
    #                                     checkpointed segment may start at it (planner.py)
    # the unit: False, tensor bytes as track_memory counts them; True, the allocator's bytes
    # (profile_layers(allocator=True)): every peak counts operations' temporaries too
    allocator: bool = False
    # allocator unit: what a checkpoint of a segment starting here holds that no operation
    # made, the random generators' states it keeps to replay them (0 in tensor bytes)
    checkpoint_state_bytes: int = 0
    # allocator unit: what autograd keeps for its backward past the saved-tensor hooks, so
    # that a checkpoint cannot drop it (a Python number wrapped into a tensor and saved, as
    # ``att * 0.125`` saves it); 0 in tensor bytes
    unhooked_bytes: int = 0
    # what ckpt_lab.checkpoint's replay of module state (module_state) costs for this layer,
    # measured by checkpointing it alone (0 for a layer without persistent buffers):
    # copies of its persistent buffers made at a checkpointed forward's entry, alive through
    # that forward
    buffer_copy_bytes: int = 0
    # those of them the forward changed (batch norm's counter), kept until the segment's
    # backward
    changed_buffer_bytes: int = 0
    # fresh copies of the changed and the saved buffers (batch norm: the counter and both
    # statistics) made when a checkpoint's recompute starts, alive until it ends
    recompute_buffer_bytes: int = 0
    # the part of those the recompute saves (plain batch norm's statistics), alive until this
    # layer's backward; counted in the recompute_* fields above too
    recompute_saved_buffer_bytes: int = 0


def replica(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in a storage of its own, laid out as `t` is: the same size, strides, storage
    offset and storage size (a slice stays a slice of a storage as big as the one it came from).

    A layer profiled on it runs the kernels, makes the copies and saves the storages it would in
    the step (a contiguous clone would hide the copy a ``Linear`` makes of a strided input), and
    a layer that writes its input in place writes the copy, never the caller's tensor.
    """
    return t.new_empty(0).set_(t.untyped_storage().clone(), t.storage_offset(), t.size(),
                               t.stride())


class _Sink(torch.autograd.Function):
    """Stands for the layers before: a replica of the input whose gradient is kept in `box`.

    Its output is not a leaf, as a layer's input in the step is not, so an in-place layer may
    write it."""

    @staticmethod
    def forward(ctx, t, box):
        ctx.box = box
        return replica(t)

    @staticmethod
    def backward(ctx, g):
        ctx.box.append(g)
        return None, None


class _Tap(torch.autograd.Function):
    """Stands for the layers after: in backward, allocates the gradient they would send."""

    @staticmethod
    def forward(ctx, y, like):
        ctx.like = like
        return y.new_empty(0)

    @staticmethod
    def backward(ctx, _):
        like = ctx.like
        base = like.new_zeros(like.untyped_storage().nbytes() // like.element_size())
        return base.as_strided(like.size(), like.stride(), like.storage_offset()), None


def _layer_input(x, requires_grad, box=None):
    """A layer's input as the step hands it over: a replica, with a history if it needs grad."""
    if not requires_grad:
        return replica(x)
    return _Sink.apply(x.detach().requires_grad_(), [] if box is None else box)


@dataclass
class _Place:
    """Where a layer sits in the step: its input (and whether it requires grad), the gradient
    the layer after it sends back (None for the last), whether the loss's head follows it."""

    layer: object
    x: torch.Tensor
    requires_grad: bool
    incoming: torch.Tensor | None
    head: bool


@dataclass
class _Run:
    """What one run of a layer alone measured (`_alone`); the fields of `LayerProfile` are read
    from two of them, the plain run and the recompute."""

    saved_bytes: int             # what its forward left saved for backward
    out_bytes: int
    saves_input: bool
    saves_output: bool
    saves_any: bool
    output_is_view: bool         # its output is its input's storage
    writes_input: bool
    forward_peak: int
    backward_peak: int           # its input held elsewhere
    held_backward_peak: int      # its input held only by what it saved
    recompute_peak: int          # up to its last save, where a recompute stops
    buffer_copies: int           # module-state copies swapped in for a recompute
    saved_buffer_copies: int     # those of them it saved
    grad: torch.Tensor | None    # the gradient it sent to its input (for the layer before)
    grad_in: int = 0             # bytes of the gradient arriving at its output


def _alone(place: _Place, backward=True, once=False, allocator=False, state=None) -> _Run:
    """Forward + backward of one layer alone, as the step runs it; returns the measurements.

    `once`: the layer's forward is a checkpoint's recompute, whose saved tensors autograd
    unpacks once and lets go of sooner than its own saved tensors. `state`: the layer's
    `ModuleState` after a checkpointed forward; the recompute runs on the fresh buffer copies
    it swaps in, as a checkpoint's does, and those it saves are held until its backward (the
    rest go when it returns: in the step, when the segment's recompute ends). `allocator`:
    bytes are the allocator's (`track_memory(allocator=True)`): every peak counts what an
    operation held only while it ran, and every level what no operation made (a Python number
    wrapped into a tensor and saved, as ``att * 0.125`` saves it)."""
    layer, incoming, head = place.layer, place.incoming, place.head
    box, packs, gone, marks = [], [], [], []
    xin = _layer_input(place.x, place.requires_grad, box)   # allocated before: held elsewhere
    version = xin._version
    store = xin.untyped_storage()
    in_ptr, in_bytes = store.data_ptr(), store.nbytes()
    with track_memory(allocator=allocator) as log:
        # after the forward only what the layer saved holds its input: when that goes, an
        # input held by nothing else would go too
        weakref.finalize(store, lambda: gone.append(len(log.timeline)))
        del store

        def mark(t):   # an operation that allocates nothing: the level between two others
            t.detach()
            marks.append(len(log.timeline) - 1)

        if state is not None:
            mark(xin)
            undo = state.swap_in()
            mark(xin)

        def pack(t):
            packs.append((t.untyped_storage().data_ptr(), len(log.timeline)))
            return held(t.detach()) if once else t.detach()

        with torch.autograd.graph.saved_tensors_hooks(pack, take if once else lambda t: t):
            try:
                y = layer(xin)
                if state is not None:
                    mark(y)
            finally:
                if state is not None:    # the copies nothing saved go here
                    state.swap_out(undo)
                    del undo
            if state is not None:
                mark(y)
            writes_input = xin._version != version
            del xin
            end = None if head else _Tap.apply(y, incoming)   # keeps the graph alive
            loss = y.float().sum() if head else None
        forward_peak, forward_ops = log.peak_bytes, len(log.timeline)
        out_bytes = y.untyped_storage().nbytes()
        out_ptr = y.untyped_storage().data_ptr()
        with_y = log.current_bytes - (loss.untyped_storage().nbytes() if head else 0)
        del y
        # the loss of the last layer is alive in backward, but no layer saved it
        own = log.current_bytes - (loss.untyped_storage().nbytes() if head else 0)
        if allocator:    # an operation that allocates nothing: the allocator's level, y gone
            (loss if head else end).detach()
        start = len(log.timeline)
        if not backward:
            pass
        elif head and loss.requires_grad:
            loss.backward()
        elif end is not None and end.requires_grad and incoming is not None:
            end.backward(end)
        del loss, end
    # read once the block is over: the allocator's levels are filled in when it exits
    lv, kept = (_allocated, own + _unseen(log.timeline[start - 1])) if allocator else (_live, own)
    forward_peak = max([forward_peak] + [lv(p) for p in log.timeline[:forward_ops]])
    backward_peak = max([kept] + [lv(p) for p in log.timeline[start:]])
    # the same backward with the input held only by what the layer saved
    until = gone[0] if gone else float("inf")
    held_peak = max([kept + in_bytes] + [lv(p) + (in_bytes if k < until else 0)
                                         for k, p in enumerate(log.timeline) if k >= start])
    saves_input = any(p == in_ptr for p, _ in packs)
    last = packs[-1][1] if packs else 0
    # the buffer copies swapped in (their level's rise), and those that outlived the swap out
    m = [_level(log.timeline[k], allocator) for k in marks]
    copies, kept_copies = (m[1] - m[0], m[1] - m[0] - (m[2] - m[3])) if marks else (0, 0)
    return _Run(
        saved_bytes=kept, out_bytes=out_bytes, saves_input=saves_input,
        saves_output=with_y == own and out_bytes > 0 and any(p == out_ptr for p, _ in packs),
        saves_any=bool(packs), output_is_view=out_ptr == in_ptr, writes_input=writes_input,
        forward_peak=forward_peak, backward_peak=backward_peak,
        held_backward_peak=held_peak if saves_input else backward_peak,
        recompute_peak=max([0] + [lv(p) for p in log.timeline[:last]]),
        buffer_copies=copies, saved_buffer_copies=kept_copies, grad=box[0] if box else None)


def _level(point, allocator: bool) -> int:
    """What was held right after an operation: tensor bytes, or the allocator's."""
    return point.allocator_bytes if allocator else point.live_bytes


def _dropped(t):
    """A checkpointed forward's pack hook: note a saved buffer (`module_state`), keep nothing."""
    saw_saved(t)


def _replay(layer, x, requires_grad, allocator=False):
    """What ``ckpt_lab.checkpoint``'s replay of module state (`module_state.ModuleState`)
    costs around one layer checkpointed alone, measured: the copies of its persistent buffers
    made at the forward's entry, and those it keeps after the forward (of the buffers the
    forward changed); with the layer's state after such a forward (the recompute measurement
    swaps it in). Zeros and None for a layer that is no module."""
    if not isinstance(layer, torch.nn.Module):
        return 0, 0, None
    hooks = lambda: torch.autograd.graph.saved_tensors_hooks(_dropped, lambda h: h)  # noqa: E731
    marks, xin = [], _layer_input(x, requires_grad)
    with track_memory(allocator=allocator) as log:
        def mark():   # an operation that allocates nothing: the level between two others
            xin.detach()
            marks.append(len(log.timeline) - 1)

        mark()
        state = ModuleState([layer])
        mark()
        with state.watching(), hooks():
            y = layer(xin)
        del y
        mark()
        del state
        mark()
    m = [_level(log.timeline[k], allocator) for k in marks]
    # the state the recompute measurement replays, settled by a checkpointed forward of its own
    state = ModuleState([layer])
    with state.watching(), hooks():
        layer(_layer_input(x, requires_grad))
    return m[1] - m[0], m[2] - m[3], state


def _live(point) -> int:
    """Tensor bytes alive after an operation."""
    return point.live_bytes


def _allocated(point) -> int:
    """The allocator's high-water mark during an operation: what it held when the operation
    returned plus what the operation held only while it ran."""
    return point.allocator_bytes + point.transient_bytes


def _unseen(point) -> int:
    """What the allocator held after an operation that no tracked storage accounts for."""
    return point.allocator_bytes - point.live_bytes


def _free_forward(layer, x, requires_grad, allocator=False) -> tuple[int, int]:
    """A layer's forward under a checkpoint, where saved-tensor hooks drop what it saves: its
    peak, and (allocator unit) what autograd keeps for its backward all the same."""
    x = _layer_input(x, requires_grad)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda h: h), \
            track_memory(allocator=allocator) as log:
        y = layer(x)
        if allocator:    # an operation that allocates nothing: the allocator's level, y alive
            y.detach()
    if not allocator:
        return log.peak_bytes, 0
    # a Python number wrapped into a tensor (``att * 0.125``) is saved without the hooks
    return log.allocator_peak_bytes, _unseen(log.timeline[-1])


def generator_state_bytes(tensors) -> int:
    """Bytes of the random generators' states a checkpoint keeps to replay them
    (``preserve_rng_state=True``): the CPU generator's (``torch.get_rng_state()``) and that of
    each CUDA device among `tensors`, all held in CPU memory and made outside the dispatcher,
    so `track_memory` never counts them; the allocator does."""
    devices = sorted({t.get_device() for t in tensors if t.is_cuda})
    states = [torch.get_rng_state()] + [torch.cuda.get_rng_state(d) for d in devices]
    return sum(t.untyped_storage().nbytes() for t in states)


def _named(layers) -> list:
    if isinstance(layers, torch.nn.Module):
        named = list(layers.named_children())
    else:
        named = [(str(i), layer) for i, layer in enumerate(layers)]
    if not named:
        raise ValueError("profile_layers needs at least one layer")
    for name, layer in named:
        if not callable(layer):
            raise ValueError(f"layer {name} is a {type(layer).__name__}, not a module")
    return named


class _Untouched:
    """Restore parameter gradients, buffers (BatchNorm statistics: each module's own objects,
    with their values) and RNG states on exit."""

    def __init__(self, modules, device):
        self.modules, self.device = modules, device

    def __enter__(self):
        mods = [m for m in self.modules if isinstance(m, torch.nn.Module)]
        self.params = [p for m in mods for p in m.parameters() if p.requires_grad]
        self.grads = [p.grad for p in self.params]
        self.buffers = [(sub._buffers, name, b, b.detach().clone()) for m in mods
                        for sub in m.modules() for name, b in sub._buffers.items()
                        if b is not None]
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        self.rng = torch.random.fork_rng(devices=devices)
        self.rng.__enter__()
        for p in self.params:  # the step's parameter gradients exist before it starts
            p.grad = torch.zeros_like(p)
        return self

    def __exit__(self, *exc):
        for p, g in zip(self.params, self.grads):
            p.grad = g
        with torch.no_grad():
            for table, name, b, saved in self.buffers:
                table[name] = b          # a forward may have put another object there
                b.copy_(saved)
        self.rng.__exit__(*exc)
        return False


def _refuse_failing_step(named, runs, x) -> None:
    """Raise if a layer writes in place what the step cannot let it write, whatever the plan:
    the chain's input when it is a leaf that requires grad, or a tensor a layer before saved."""
    for i, (name, layer) in enumerate(named):
        if not runs[i].writes_input:
            continue
        r = i - 1                      # the layer that made the storage layer i writes
        while r >= 0 and runs[r].output_is_view:
            r -= 1
        if r < 0 and x.is_leaf and x.requires_grad:
            raise ValueError(
                f"layer {name} ({layer!r}) writes the chain's input in place, and x is a leaf "
                "that requires grad: autograd refuses that in the step itself ('a leaf Variable "
                "that requires grad is being used in an in-place operation'). Make the layer out "
                "of place (inplace=False) or give the chain an input that is not a leaf.")
        savers = [j for j in range(max(r, 0), i) if (j == r and runs[j].saves_output)
                  or (j > r and runs[j].saves_input)]
        if savers:
            raise ValueError(
                f"layer {name} ({layer!r}) writes its input in place, which layer "
                f"{named[savers[0]][0]} saved for backward: every step of this chain fails "
                "('modified by an inplace operation'), checkpointed or not. Make the layer out "
                "of place (inplace=False).")


def profile_layers(layers, x: torch.Tensor, repeats: int = 3,
                   step: bool = True, allocator: bool = False) -> list[LayerProfile]:
    """Profile a chain layer by layer: the input of the planner, the formulas and the step model.

    `act_bytes[i]` counts the storages that layer i is first to save for backward (its own
    intermediates, its output if it saves it, its input if no earlier layer saved that already),
    so the sum over any run of layers is exactly what that run pins. `out_bytes[i]` is the size
    of its output. Forward time is the median of `repeats` runs with grad enabled. The other
    fields (see `LayerProfile`) are measured with each layer run alone, and `x` is treated as
    the step treats it: allocated before, with its own `requires_grad`; among them the copies
    of module buffers a checkpoint makes to replay module state, measured on a checkpointed
    run of the layer (`buffer_copy_bytes`, `changed_buffer_bytes`, `recompute_buffer_bytes`,
    `recompute_saved_buffer_bytes`). Parameter `.grad`, buffers and random number generators
    are left as they were. `step=False` measures only the activation model's fields (one
    forward per layer, about a third of the time).

    ``allocator=True`` measures in the allocator's bytes (`track_memory(allocator=True)`):
    every peak counts what an operation allocated and freed inside itself, every saved-bytes
    figure what the allocator holds that no operation made (a wrapped Python number autograd
    saves), and `unhooked_bytes` and `checkpoint_state_bytes` what a checkpoint cannot drop
    and what it adds (the generator states it keeps), so that `planner.step_peak_bytes`
    predicts the step's `allocator_peak_bytes`. Every layer then runs under
    ``torch.profiler``, which refuses to start inside another profiler.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, numbers.Integral) or repeats < 1:
        raise ValueError("repeats must be an int >= 1")
    named = _named(layers)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a tensor (the chain's input), got {type(x).__name__}")
    n = len(named)
    with _Untouched([m for _, m in named], x.device):
        # forward, layer by layer: each layer's input, whether it requires grad, its time
        # (every run gets a replica of its input: the caller's x and the inputs kept here stay
        # as they were when a layer writes its input in place)
        inputs, needs, seconds, free, replay = [], [], [], [], []
        h, req = x.detach(), x.requires_grad and x.is_floating_point()
        for _, layer in named:
            inputs.append(h)
            needs.append(req)
            if step:
                free.append(_free_forward(layer, h, req, allocator))
                replay.append(_replay(layer, h, req, allocator))
            times = []
            for _ in range(repeats):
                xin = _layer_input(h, req)
                start = time.perf_counter()
                y = layer(xin)
                if y.is_cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            seconds.append(sorted(times)[len(times) // 2])
            h, req = y.detach(), bool(y.requires_grad)
            del y, xin
        # backward, from the last layer: each layer gets the gradient the next one sent
        plain, again, incoming = [None] * n, [None] * n, None
        for i in reversed(range(n)):
            head = i == n - 1
            place = _Place(named[i][1], inputs[i].detach(), needs[i], incoming, head)
            if not step:
                plain[i] = _alone(place, backward=False, allocator=allocator)
                continue
            plain[i] = _alone(place, allocator=allocator)
            with phase("recompute"):
                again[i] = _alone(place, once=True, allocator=allocator, state=replay[i][2])
            replay[i] = replay[i][:2]
            plain[i].grad_in = 0 if incoming is None and not head else (
                4 if head else incoming.untyped_storage().nbytes())
            incoming = plain[i].grad
            plain[i].grad = again[i].grad = None
    _refuse_failing_step(named, plain, x)
    params = [p for _, m in named if isinstance(m, torch.nn.Module) for p in m.parameters()]
    out = []
    for i, (name, _) in enumerate(named):
        run, rerun = plain[i], again[i]
        first_saves_input = run.saves_input and i > 0 and not plain[i - 1].saves_output
        extra = plain[i - 1].out_bytes if first_saves_input else 0
        if not step:
            out.append(LayerProfile(name, run.saved_bytes + extra, run.out_bytes, seconds[i],
                                    allocator=allocator))
            continue
        # checkpoint_sequential's checkpoints see every layer's parameters and their input
        state = generator_state_bytes([inputs[i]] + params) if allocator else 0
        out.append(LayerProfile(
            name=name, act_bytes=run.saved_bytes + extra, out_bytes=run.out_bytes,
            forward_seconds=seconds[i], work_bytes=run.backward_peak - run.saved_bytes,
            own_bytes=run.saved_bytes, saves_input=run.saves_input,
            saves_output=run.saves_output, output_is_view=run.output_is_view,
            writes_input=run.writes_input, saves_any=run.saves_any,
            forward_peak_bytes=run.forward_peak, free_forward_peak_bytes=free[i][0],
            backward_peak_bytes=run.backward_peak,
            held_backward_peak_bytes=run.held_backward_peak, grad_in_bytes=run.grad_in,
            recompute_own_bytes=rerun.saved_bytes,
            recompute_forward_peak_bytes=rerun.forward_peak,
            recompute_peak_bytes=rerun.recompute_peak,
            recompute_backward_peak_bytes=rerun.backward_peak,
            recompute_held_backward_peak_bytes=rerun.held_backward_peak,
            allocator=allocator, checkpoint_state_bytes=state, unhooked_bytes=free[i][1],
            buffer_copy_bytes=replay[i][0], changed_buffer_bytes=replay[i][1],
            recompute_buffer_bytes=rerun.buffer_copies,
            recompute_saved_buffer_bytes=rerun.saved_buffer_copies))
    return out


def backward_work_bytes(layers, x: torch.Tensor) -> list[int]:
    """Per layer, the most bytes its backward holds beyond what its forward saved: the gradient
    arriving at its output, the one it sends on, and any temporaries (measured one layer at a
    time, input requiring grad; parameter gradients exist beforehand, so they are not counted,
    and the model's `.grad` are left as they were)."""
    x = x.detach().requires_grad_(x.is_floating_point())
    return [p.work_bytes for p in profile_layers(layers, x, repeats=1)]
