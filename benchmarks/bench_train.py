"""What checkpointing costs a GPT training step: time, peak memory and counted FLOPs.

For the GPT preset and the policies none, every block, segments of 2 blocks, selective (attention
core only, Megatron's "selective"), the same core recomputed by PyTorch's own selective
checkpointing, and an op-level policy (each block checkpointed, matmul outputs saved) by
ckpt_lab and by PyTorch, one run measures the forward + backward time (median of paired,
rotating repeats after warm-up), the exact peak from `track_memory`, and the FLOPs that
``torch.utils.flop_counter.FlopCounterMode`` counts around forward + backward (matmuls and
attention; element-wise ops are not counted). The expectation to check: full recomputation
adds about one forward, so ~4/3 = 1.33x the FLOPs of a step (forward 1 + backward 2 +
recompute 1); the measured time ratio is reported beside the FLOP ratio.

Time is not FLOPs: a recompute also re-runs element-wise ops (softmax, masks, GELU) and
redraws dropout masks, which FlopCounterMode does not count and which on a CPU cost as much
as small matmuls. So each row also gets ``op_seconds``, the summed time of every ATen op of
one step (timed one by one), and ``extra_ops``, the ops that cost more than under "none":
the recompute's real bill.

``rerun_ratio`` is what re-running costs by itself: the plain step plus the time the plain
model spends in the forward of the modules the policy re-runs (the attention cores for
"selective", the blocks for "every"), timed with module hooks in the same steps. What the
checkpointed step costs beyond it, ``overhead_points`` (percentage points of the plain step),
is the implementation's own Python and dispatch work; early stopping skips the last op of a
re-run module, so an implementation can land a little under it. On a CPU the selective row's
re-run ratio sits far above its FLOP ratio: softmax, the mask, the scale and above all
dropout's Bernoulli draw cost time that FlopCounterMode does not count, so no implementation
of Megatron's selective recomputation brings its time down to its FLOPs there.
Run: python -m benchmarks.bench_train [--quick] [--one-thread]  (writes benchmarks/results/train.json)
"""
from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.utils.checkpoint as tuc
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab import checkpoint, track_memory
from ckpt_lab.measure.timing import forward_share
from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config
from ckpt_lab.checkpoint.selective import save_matmuls

OUT = Path(__file__).parent / "results" / "train.json"
TORCH_SAC = "(torch SAC)"
POLICIES = ("none", "every", "every:2", "selective", f"selective {TORCH_SAC}", "save_matmuls",
            f"save_matmuls {TORCH_SAC}")


def _sac_context(save) -> functools.partial:
    """PyTorch's selective checkpoint contexts: MUST_SAVE the ops `save(op)` picks."""
    def policy(ctx, op, *args, **kwargs):
        return (tuc.CheckpointPolicy.MUST_SAVE if save(op)
                else tuc.CheckpointPolicy.PREFER_RECOMPUTE)
    return functools.partial(tuc.create_selective_checkpoint_contexts, policy)


class _TorchSACCore(nn.Module):
    """An attention core run under ``torch.utils.checkpoint`` with selective contexts that
    recompute every op of it: the same ops ckpt_lab's "selective" recomputes."""

    def __init__(self, core: nn.Module):
        super().__init__()
        self.core, self.context_fn = core, _sac_context(lambda op: False)

    def forward(self, q, k, v):
        if not torch.is_grad_enabled():
            return self.core(q, k, v)
        return tuc.checkpoint(self.core, q, k, v, use_reentrant=False,
                              context_fn=self.context_fn)


class _PerBlock(nn.Module):
    """A GPT whose blocks each run through `step(block, x)`: an op-level policy per block."""

    def __init__(self, model: nn.Module, step):
        super().__init__()
        self.model, self.step = model, step

    def forward(self, x, targets):
        layers, m = self.model.layers(), self.model
        a, b = m.first_block, m.first_block + m.num_blocks
        h = layers[0](x) if a == 1 else nn.Sequential(*layers[:a])(x)
        for block in layers[a:b]:
            h = self.step(block, h)
        for layer in layers[b:]:
            h = layer(h)
        return m.loss(h, targets)


def _build(cfg, name: str) -> nn.Module:
    """The model that runs policy `name` (see POLICIES)."""
    if name == f"selective {TORCH_SAC}":
        model = build_model(cfg, "none")
        for block in model.blocks():
            block.attn.core = _TorchSACCore(block.attn.core)
        return model
    if name == "save_matmuls":
        return _PerBlock(build_model(cfg, "none"),
                         lambda block, h: checkpoint(block, h, policy="save_matmuls"))
    if name == f"save_matmuls {TORCH_SAC}":
        context_fn = _sac_context(save_matmuls)
        return _PerBlock(build_model(cfg, "none"), lambda block, h: tuc.checkpoint(
            block, h, use_reentrant=False, context_fn=context_fn))
    return build_model(cfg, name)


class _OpTimer(TorchDispatchMode):
    """Sums the time of every ATen op run, per op: wall time after a sync on CUDA, CPU time
    of this process on CPU (steadier than wall time on a shared machine)."""

    def __init__(self, cuda: bool):
        super().__init__()
        self.cuda, self.seconds = cuda, {}
        self.clock = time.perf_counter if cuda else time.process_time

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = self.clock()
        out = func(*args, **(kwargs or {}))
        if self.cuda:
            torch.cuda.synchronize()
        name = func.overloadpacket.__name__
        self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start
        return out


def _op_seconds(model, x, y, repeats: int = 5) -> dict[str, float]:
    """Per ATen op, its summed time in one forward + backward (median of `repeats` steps)."""
    runs = []
    for _ in range(repeats):
        with _OpTimer(x.is_cuda) as timer:
            model(x, y).backward()
        model.zero_grad(set_to_none=True)
        runs.append(timer.seconds)
    return {op: statistics.median(r.get(op, 0.0) for r in runs) for op in runs[0]}


def _rerun_share(model, x, y, modules, repeats: int) -> float:
    """The share of a plain step spent in the forward of `modules` (`ckpt_lab.measure.timing.forward_share`)."""
    def step():
        model(x, y).backward()
        model.zero_grad(set_to_none=True)
    return forward_share(step, modules, repeats, device=x.device)


def _setup(quick: bool, device: str):
    if device == "cuda":
        preset, batch = ("gpt-cpu", 8) if quick else ("gpt-gpu", 8)
    else:
        preset, batch = ("gpt-tiny", 4) if quick else ("gpt-cpu", 8)
    return preset, get_config(preset), batch


def _fwd_bwd(model, x, y) -> float:
    """One forward + backward; returns its wall time in seconds."""
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    model(x, y).backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


def _flops(model, x, y) -> tuple[int, int]:
    """(forward FLOPs, forward + backward FLOPs, recompute included) as counted by PyTorch."""
    with FlopCounterMode(display=False) as fwd_counter:
        loss = model(x, y)
    forward = fwd_counter.get_total_flops()
    with FlopCounterMode(display=False) as bwd_counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return forward, forward + bwd_counter.get_total_flops()


def main(out_path: Path | None = None, quick: bool = False, threads: int | None = None) -> dict:
    """Measure every policy on the GPT preset, write JSON, and return the result dict.

    threads: CPU threads for torch (None leaves the setting alone; 1 gives steadier times on
    a busy machine, where two threads on two shared cores stall each other).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset, cfg, batch = _setup(quick, device)
    repeats = 5 if quick else 9
    x, y = TextBatches(load_corpus(), batch, cfg.block_size, seed=0).get(0)
    x, y = x.to(device), y.to(device)
    models = {p: _build(cfg, p).to(device).train() for p in POLICIES}
    rows, ops = {}, {}
    for name, model in models.items():
        for _ in range(2):
            _fwd_bwd(model, x, y)
        if x.is_cuda:
            torch.cuda.reset_peak_memory_stats()   # so the allocator's peak is the step's
        with track_memory() as mem:
            _fwd_bwd(model, x, y)
        forward, total = _flops(model, x, y)
        ops[name] = _op_seconds(model, x, y)
        rows[name] = {"peak_bytes": mem.peak_bytes, "cuda_peak_bytes": mem.cuda_peak_bytes,
                      "forward_flops": forward, "step_flops": total, "times": [],
                      "op_seconds": sum(ops[name].values())}
    names = list(models)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rows[name]["times"].append(_fwd_bwd(models[name], x, y))
    plain = models["none"]
    rerun = {"selective": [block.attn.core for block in plain.blocks()],   # what each re-runs
             "every": plain.blocks()}
    shares = {kind: _rerun_share(plain, x, y, modules, repeats) for kind, modules in rerun.items()}
    base = rows["none"]
    base_time = statistics.median(base["times"])
    for row in rows.values():
        row["median_seconds"] = statistics.median(row.pop("times"))
        row["recompute_flops"] = row["step_flops"] - base["step_flops"]
        row["extra_forwards"] = row["recompute_flops"] / base["forward_flops"]
        row["flop_ratio"] = row["step_flops"] / base["step_flops"]
        row["time_ratio"] = row["median_seconds"] / base_time
        row["peak_ratio"] = row["peak_bytes"] / base["peak_bytes"]
        row["op_ratio"] = row["op_seconds"] / base["op_seconds"]
    for name, row in rows.items():
        kind = next((k for k in shares if name.startswith(k)), None)
        row["rerun_ratio"] = None if kind is None else 1 + shares[kind]
        row["overhead_points"] = (None if kind is None else
                                  round(100 * (row["time_ratio"] - row["rerun_ratio"]), 1))
    for name, row in rows.items():
        extra = {op: ops[name].get(op, 0.0) - ops["none"].get(op, 0.0) for op in ops[name]}
        row["extra_ops"] = {op: round(sec / base["op_seconds"], 4) for op, sec in
                            sorted(extra.items(), key=lambda kv: -kv[1])[:5] if sec > 0}
    result = {
        "device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "preset": preset, "config": asdict(cfg), "batch_size": batch, "repeats": repeats,
        "timed": "forward + backward (recompute included), median of paired repeats",
        "expectation": "full recomputation ('every') ~ 4/3 = 1.33x the FLOPs of a step",
        "op_ratio": "summed time of the ATen ops of a step (each timed alone) over 'none': "
                    "what the recompute costs, element-wise ops and dropout masks included",
        "extra_ops": "the 5 ops whose summed time grew most over 'none', as a fraction of "
                     "the 'none' step's op time",
        "rerun_ratio": "1 + the share of a plain step spent in the forward of the modules the "
                       "policy re-runs (cores for selective, blocks for every): what re-running "
                       "them costs by itself, whatever the implementation",
        "overhead_points": "100 * (time_ratio - rerun_ratio): the implementation's own cost "
                           "(early stopping can make it negative)",
        "policies": rows,
    }
    out = Path(out_path) if out_path is not None else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        rerun = (f"   re-run x{row['rerun_ratio']:.2f} ({row['overhead_points']:+.1f} pts)"
                 if row["rerun_ratio"] else "")
        print(f"{name:25s} time {row['median_seconds'] * 1e3:8.1f} ms  x{row['time_ratio']:.2f}"
              f"   FLOPs x{row['flop_ratio']:.3f} ({row['extra_forwards']:.2f} extra forwards)"
              f"   op time x{row['op_ratio']:.2f}{rerun}"
              f"   peak {row['peak_bytes'] / 2**20:7.2f} MiB  x{row['peak_ratio']:.2f}")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main(quick="--quick" in sys.argv, threads=1 if "--one-thread" in sys.argv else None)
