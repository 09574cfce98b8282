"""Every benchmark in one command (`make bench`): each writes its JSON to benchmarks/results/."""
import importlib
import pkgutil
import sys
from pathlib import Path


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
    main(quick="--quick" in sys.argv)
