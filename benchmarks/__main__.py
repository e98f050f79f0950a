"""Run every benchmarks/bench_*.py module's main() in turn: python -m benchmarks [name-substring ...]."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    wanted = sys.argv[1:] if argv is None else argv
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    if wanted:
        names = [n for n in names if any(w in n for w in wanted)]
    if not names:
        print(f"no benchmark matches {wanted}; available: bench_*.py modules in {Path(__file__).parent}")
        return 1
    for name in names:
        print(f"\n=== benchmarks.{name} ===", flush=True)
        t0 = time.perf_counter()
        importlib.import_module(f"benchmarks.{name}").main()
        print(f"=== {name}: {time.perf_counter() - t0:.1f} s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
