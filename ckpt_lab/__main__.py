"""Command line: `ckpt-lab plan --layers 48 --hidden 4096 ... --device-memory 80GB`, or
`ckpt-lab plan --arch llama2-70b --micro-batch 1 --device-memory 141GB`, or fine-tuning:
`ckpt-lab plan --arch llama2-7b --lora-rank 16 --base-bits 4 --optimizer paged_adamw8bit
--device-memory 24GB`.

The same tool runs as `python -m ckpt_lab`; usage lines name whichever way it was started.
"""
from __future__ import annotations

import argparse
import os
import sys

from .capacity import (ARCHITECTURES, DEFAULT_HEADROOM, TransformerConfig, parse_bytes,
                       plan_table)
from .formulas import ATTENTIONS, BASE_BITS, MLPS, OPTIMIZERS, PRECISIONS, STYLES

SHAPE = ("layers", "hidden", "heads", "seq")


def program_name(argv0: str | None = None) -> str:
    """How the user started us: `ckpt-lab` (the installed script) or `python -m ckpt_lab`."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    name = os.path.basename(argv0)
    return "python -m ckpt_lab" if name in ("__main__.py", "-m", "") else name


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with its `plan` subcommand."""
    parser = argparse.ArgumentParser(prog=prog or program_name(),
                                     description="ckpt-lab tools")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="memory of each checkpointing strategy on a device")
    plan.add_argument("--arch", choices=sorted(ARCHITECTURES),
                      help="a published model; the options below override its fields")
    for name in SHAPE:
        plan.add_argument(f"--{name}", type=int, help="required without --arch")
    plan.add_argument("--micro-batch", type=int, default=1)
    plan.add_argument("--vocab", type=int, help="default 50257, or the --arch's")
    plan.add_argument("--kv-heads", type=int, help="grouped-query attention (default: --heads)")
    plan.add_argument("--mlp", choices=MLPS, help="gelu (4h, default) or swiglu (3 matrices)")
    plan.add_argument("--intermediate", type=int, help="MLP width (default 4h / about 8h/3)")
    plan.add_argument("--attention", choices=ATTENTIONS,
                      help="eager (scores stored, default) or sdpa (fused, no s^2 term)")
    plan.add_argument("--style", choices=STYLES, help="gpt (default) or llama bookkeeping")
    plan.add_argument("--dropout", choices=("on", "off"), help="default: on for gpt style")
    plan.add_argument("--precision", choices=sorted(PRECISIONS), default="mixed")
    plan.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                      help="adamw8bit: bitsandbytes' 8-bit Adam; paged_*: its state may move "
                           "to the host while activations peak")
    plan.add_argument("--lora-rank", type=int,
                      help="fine-tune LoRA adapters of this rank on every block's linear "
                           "layers, the base frozen (default: full training)")
    plan.add_argument("--base-bits", type=int, choices=BASE_BITS, default=16,
                      help="bits of the frozen base's weights with --lora-rank: 16, 8 "
                           "(LLM.int8) or 4 (NF4, QLoRA)")
    plan.add_argument("--device-memory", required=True, help="e.g. 80GB, 24GiB")
    plan.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                      help="fraction of the device the peak may use (default 0.85)")
    return parser


def main(argv=None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    fields = {k: getattr(args, k) for k in SHAPE + ("vocab", "kv_heads", "mlp", "intermediate",
                                                     "attention", "style")}
    fields = {k: v for k, v in fields.items() if v is not None}
    if args.dropout is not None:
        fields["dropout"] = args.dropout == "on"
    fields.update(micro_batch=args.micro_batch, precision=args.precision,
                  optimizer=args.optimizer, lora_rank=args.lora_rank, base_bits=args.base_bits)
    try:
        if args.arch:
            cfg = TransformerConfig.named(args.arch, **fields)
        else:
            missing = [f"--{k}" for k in SHAPE if k not in fields]
            if missing:
                parser.error(f"give {', '.join(missing)}, or a published model with --arch")
            cfg = TransformerConfig(**fields)
        print(plan_table(cfg, parse_bytes(args.device_memory), args.headroom))
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
