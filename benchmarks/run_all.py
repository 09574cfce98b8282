"""Every benchmark in one command (`make bench`): each writes its JSON to benchmarks/results/.

`python -m benchmarks.run_all [--quick] [--notes "..."]`: the notes (say, that the machine was
shared while it ran) go into every JSON the run writes (`benchmarks.machine.notes`)."""
import argparse
import importlib
import os
import pkgutil
from pathlib import Path

from benchmarks.machine import NOTES_VARIABLE


def main(quick: bool = False) -> list[str]:
    """Run each benchmarks/bench_*.py module's main(); returns the names that ran."""
    ran = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        if info.name.startswith("bench_"):
            module = importlib.import_module(f"benchmarks.{info.name}")
            print(f"== {info.name}", flush=True)
            module.main(quick=quick)
            ran.append(info.name)
    return ran


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run every benchmark; each writes its JSON.")
    parser.add_argument("--quick", action="store_true", help="the small sizes (a smoke test)")
    parser.add_argument("--notes", help="a note every JSON of this run carries")
    args = parser.parse_args()
    if args.notes:
        os.environ[NOTES_VARIABLE] = args.notes
    main(quick=args.quick)
