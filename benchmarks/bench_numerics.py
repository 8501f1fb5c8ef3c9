"""Numerical deviation from an fp64 reference (measurement: _numerics.py).

    python benchmarks/bench_numerics.py [options]   # = bench_attention.py --numerics --skip-timing [options]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402


def main(argv=None) -> int:
    return bench_attention.main(["--numerics", "--skip-timing"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
