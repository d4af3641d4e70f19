"""Collision test benchmark: 10,000 distinct prompts (about 5e7 pairs) on SmolLM2-135M, CPU.

    python benchmarks/collisions_bench.py --prompts 10000 --extension-pairs 10

Writes benchmarks/results/collisions_<N>.json (min distance per layer, 10 closest pairs, the
one-token-extension test of the 10 closest pairs at layer 1 over every distinct token) and the
histogram next to it, then adds the wall time of the whole command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10000)
    ap.add_argument("--extension-pairs", type=int, default=10)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    from solver.io import atomic_write_json
    from unmask.cli import main as cli

    path = Path(args.out) / f"collisions_{args.prompts}.json"
    t0 = time.perf_counter()
    rc = cli(["collisions", "--prompts", str(args.prompts), "--extension-pairs", str(args.extension_pairs),
              "--json", str(path)])
    wall = time.perf_counter() - t0
    res = json.loads(path.read_text())
    res["wall_seconds"] = wall
    res["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared)"
    res["command"] = f"python benchmarks/collisions_bench.py --prompts {args.prompts} --extension-pairs {args.extension_pairs}"
    atomic_write_json(path, res)
    print(f"wall time {wall:.1f} s, exit {rc}")


if __name__ == "__main__":
    main()
