"""Command line: `ckpt-lab plan --layers 48 --hidden 4096 ... --device-memory 80GB`.

The same tool runs as `python -m ckpt_lab`; usage lines name whichever way it was started.
"""
from __future__ import annotations

import argparse
import os
import sys

from .capacity import DEFAULT_HEADROOM, TransformerConfig, parse_bytes, plan_table
from .formulas import OPTIMIZERS, PRECISIONS


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
