"""Per-rank memory when training is spread over several devices: the formulas of lesson 12.

* Data parallel (DDP) copies everything: each rank holds the whole model state, plus DDP's
  flat gradient buckets, and the activations of its share of the batch.
* Fully sharded data parallel (FSDP, ZeRO-3) divides the model state by the world size; the
  activations are not divided (each rank still runs whole layers on its rows), and each rank
  briefly holds whole units: the all-gathered parameters of the unit it runs, the next unit's
  all-gather buffer (prefetched) and the unit's unsharded gradients before they are
  reduce-scattered. So the largest unit, not the whole model, sets that extra.
* Pipeline stages split the layers; a stage keeps the activations of every micro-batch it has
  run forward but not yet backward, so the schedule decides how many.
* Tensor (and sequence) parallelism splits the inside of every layer; Megatron's activation
  formula per layer follows from the single-device one term by term.

Bytes are ints; `ckpt_lab.plan.formulas` holds the single-device formulas used here.
"""
from __future__ import annotations

from . import formulas
from .formulas import _check_int


# ------------------------------------------------------------------------ data parallel
def ddp_state_bytes(num_params: int, optimizer: str = "adam", dtype_bytes: int = 4,
                    gradient_as_bucket_view: bool = False) -> int:
    """Per-rank model state under DDP (fp32): parameters, gradients, DDP's gradient buckets
    (a second copy of the gradients unless gradient_as_bucket_view=True) and optimizer states.
    The same on every rank, whatever the world size."""
    _check_int("num_params", num_params)
    states = formulas.OPTIMIZER_STATES[optimizer]
    copies = 1 + 1 + (0 if gradient_as_bucket_view else 1) + states
    return num_params * dtype_bytes * copies


def shard_numel(numel: int, world_size: int) -> int:
    """Elements of one rank's shard of a tensor split along its first dim (padded up)."""
    _check_int("world_size", world_size, 1)
    return -(-numel // world_size)


def fsdp_state_bytes(param_numels, world_size: int, optimizer: str = "adam",
                     dtype_bytes: int = 4) -> int:
    """Per-rank model state under FSDP (ZeRO-3): each parameter, its gradient and its
    optimizer states are sharded, so a rank keeps about 1/world_size of each.

    `param_numels` are the parameters' sizes (each is sharded on its own; FSDP2 pads a
    shard up when the first dim does not divide; here sizes are rounded up per tensor)."""
    states = formulas.OPTIMIZER_STATES[optimizer]
    local = sum(shard_numel(n, world_size) for n in param_numels)
    return local * dtype_bytes * (2 + states)


def fsdp_unit_extra_bytes(largest_unit_bytes: int, prefetch: bool = True) -> int:
    """The most bytes FSDP adds on top of sharded state and activations while a unit runs its
    backward: its all-gathered parameters, its unsharded gradients (before the
    reduce-scatter), and with backward prefetch the next unit's all-gather buffer."""
    _check_int("largest_unit_bytes", largest_unit_bytes)
    return largest_unit_bytes * (3 if prefetch else 2)


def per_rank_peak_bytes(state_bytes: int, activation_peak_bytes: int,
                        unit_extra_bytes: int = 0) -> int:
    """A rank's step peak: its model state + its activations' peak (at its share of the batch)
    + whatever the sharding adds (0 for DDP; `fsdp_unit_extra_bytes` for FSDP)."""
    return state_bytes + activation_peak_bytes + unit_extra_bytes


# ---------------------------------------------------------------------------- pipelines
def in_flight(schedule: str, stages: int, rank: int, micro_batches: int) -> int:
    """Micro-batches a stage holds activations for at once: all of them under GPipe, at most
    stages - rank under 1F1B (Narayanan et al. 2021)."""
    _check_int("stages", stages, 1)
    _check_int("micro_batches", micro_batches, 1)
    if not 0 <= rank < stages:
        raise ValueError(f"rank must be in [0, {stages}), got {rank}")
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(stages - rank, micro_batches)
    raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")


def stage_stash_bytes(layers, spans, tokens: int, vocab: int, last: bool,
                      dtype_bytes: int = 4) -> int:
    """Bytes a stage keeps per micro-batch between its forward and its backward.

    `layers` are the whole model's `formulas.LayerBytes` (at the micro-batch), `spans` the
    stage's (start, end, checkpointed) runs. A checkpointed run keeps its input; a plain run
    what it saves. A stage also keeps what it received (the first run's input: the gradient
    goes back to the previous stage through it) and, except on the last stage, what it sent
    (backward starts from it); the last stage keeps the loss's log-softmax instead.
    """
    start = spans[0][0]
    total = layers[start - 1].out_bytes if start > 0 else 0       # the received input
    for a, b, checkpointed in spans:
        if not checkpointed:
            total += sum(layer.inner_bytes for layer in layers[a:b])
            total += formulas._live_outputs(layers, a, b)
            total += layers[a - 1].out_bytes if a > start and layers[a].keeps_input else 0
        elif a > start:
            total += layers[a - 1].out_bytes                        # a checkpoint's input
    end = spans[-1][1]
    if last:
        total += formulas.loss_bytes(tokens, vocab, dtype_bytes)
    elif not (spans[-1][2] is False and layers[end - 1].keeps_output):
        total += layers[end - 1].out_bytes                           # the output it sent
    return total


def pipeline_peak_bytes(one_in_flight_peak_bytes: int, stash_bytes: int,
                        micro_batches_in_flight: int) -> int:
    """A stage's peak: its peak with one micro-batch in flight, plus a stash for each other."""
    return one_in_flight_peak_bytes + (micro_batches_in_flight - 1) * stash_bytes


# ------------------------------------------------------------ tensor / sequence parallel
REPLICATED_UNDER_TP = ("layernorm 1 input", "QKV projection input",
                       "attention output dropout mask", "layernorm 2 input",
                       "MLP up-projection input", "MLP dropout mask")


def megatron_tp_terms(seq: int, batch: int, hidden: int, heads: int, tp: int,
                      sequence_parallel: bool = False) -> dict[str, float]:
    """`formulas.megatron_layer_terms`, per tensor-parallel rank.

    Tensor parallelism (Megatron: column-parallel QKV and MLP up-projection, row-parallel
    output projections) splits every tensor between the first and the second matmul of each
    half by t: Q, K, V, the attention core, the GeLU and the projections' inputs. The layer
    norms' inputs, the inputs of the first matmuls (the layer norms' outputs) and the two
    dropout masks after the row-parallel matmuls are whole on every rank: 10 sbh of the 34.
    Sequence parallelism splits those along the sequence (Korthikanti et al. 2022, sec. 4.2.2).
    """
    _check_int("tp", tp, 1)
    terms = formulas.megatron_layer_terms(seq, batch, hidden, heads)
    return {k: v / (tp if sequence_parallel or k not in REPLICATED_UNDER_TP else 1)
            for k, v in terms.items()}


def megatron_tp_layer_bytes(seq: int, batch: int, hidden: int, heads: int, tp: int,
                            sequence_parallel: bool = False) -> float:
    """Activation bytes per layer per rank: sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
    sbh(34 + 5as/h)/t with tensor and sequence parallelism (16-bit, 1-byte masks)."""
    return sum(megatron_tp_terms(seq, batch, hidden, heads, tp, sequence_parallel).values())
