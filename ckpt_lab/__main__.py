"""Command line: `python -m ckpt_lab plan --layers 48 --hidden 4096 ... --device-memory 80GB`."""
from __future__ import annotations

import argparse
import sys

from .capacity import DEFAULT_HEADROOM, TransformerConfig, parse_bytes, plan_table
from .formulas import OPTIMIZERS, PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its `plan` subcommand."""
    parser = argparse.ArgumentParser(prog="python -m ckpt_lab",
                                     description="ckpt-lab tools")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="memory of each checkpointing strategy on a device")
    plan.add_argument("--layers", type=int, required=True)
    plan.add_argument("--hidden", type=int, required=True)
    plan.add_argument("--heads", type=int, required=True)
    plan.add_argument("--seq", type=int, required=True)
    plan.add_argument("--micro-batch", type=int, default=1)
    plan.add_argument("--vocab", type=int, default=50257)
    plan.add_argument("--precision", choices=sorted(PRECISIONS), default="mixed")
    plan.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    plan.add_argument("--device-memory", required=True, help="e.g. 80GB, 24GiB")
    plan.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                      help="fraction of the device the peak may use (default 0.85)")
    return parser


def main(argv=None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = TransformerConfig(args.layers, args.hidden, args.heads, args.seq, args.vocab,
                                args.micro_batch, args.precision, args.optimizer)
        print(plan_table(cfg, parse_bytes(args.device_memory), args.headroom))
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
