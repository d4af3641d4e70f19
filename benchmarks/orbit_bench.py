"""The orbit-norm search of `solver.symmetry.balance_orbit`: batched Newton (`orbit_norm_newton`,
the default) against one scipy BFGS run per start (``method="bfgs"``, the search before it), in one
run on the same points.

    OPENBLAS_NUM_THREADS=1 python benchmarks/orbit_bench.py [--cells 8x16:40,16x32:20,64x128:3]
        [--json benchmarks/results/orbit_bench.json]

For each one-head planted instance (d, n, seeds 0..count-1) the closed form's point (`algebraic_init`,
a far orbit representative) goes through `orbit_norm_search` with each method, then `balance`
polishes ``act(Q, X)``, as `balance_orbit` does. Reports CPU seconds of the search per method, their
ratio, and the balanced norms (the planted X's for reference): the two searches are local
minimisations from the same starts, so equal norms say the faster one lost nothing on these seeds.
Prints a table; writes JSON atomically.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from solver import planted_instance  # noqa: E402
from solver.algebraic import algebraic_init  # noqa: E402
from solver.io import atomic_write_json  # noqa: E402
from solver.symmetry import balance, orbit_norm_search, symmetries  # noqa: E402


def one(problem, X0, sym, method: str) -> tuple[float, float]:
    """CPU seconds of the search from the closed form's point X0, and the balanced norm it leads to."""
    t = time.process_time()
    Q = orbit_norm_search(problem, sym, X0, method=method)
    seconds = time.process_time() - t
    norm = balance(sym, sym.act(Q, X0))[1] if Q is not None else float("nan")
    return seconds, norm


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="8x16:40,16x32:20,64x128:3", help="DxN:SEEDS, one head")
    ap.add_argument("--json", default="benchmarks/results/orbit_bench.json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'(d, n)':>10} {'seeds':>5} {'newton s':>9} {'bfgs s':>9} {'ratio':>7} {'same norm':>9} {'worst rel diff':>14}")
    for cell in args.cells.split(","):
        size, count = cell.split(":")
        d, n = (int(x) for x in size.split("x"))
        per_seed = []
        for seed in range(int(count)):
            problem, X = planted_instance(d, n, heads=1, seed=seed)
            X0, sym = algebraic_init(problem), symmetries(problem)
            tn, nn = one(problem, X0, sym, "newton")
            tb, nb = one(problem, X0, sym, "bfgs")
            planted = float(np.linalg.norm(X))
            per_seed.append({"seed": seed, "newton_seconds": tn, "bfgs_seconds": tb, "newton_norm": nn,
                             "bfgs_norm": nb, "planted_norm": planted})
        tn = sum(r["newton_seconds"] for r in per_seed)
        tb = sum(r["bfgs_seconds"] for r in per_seed)
        diffs = [abs(r["newton_norm"] - r["bfgs_norm"]) / r["bfgs_norm"] for r in per_seed]
        same = sum(x <= 1e-9 for x in diffs)
        row = {"d": d, "n": n, "seeds": len(per_seed), "newton_seconds": tn, "bfgs_seconds": tb,
               "ratio": tn / tb if tb else None, "same_norm": same, "worst_rel_diff": max(diffs),
               "newton_lower": sum(r["newton_norm"] < r["bfgs_norm"] * (1 - 1e-9) for r in per_seed),
               "per_seed": per_seed}
        rows.append(row)
        print(f"{f'({d}, {n})':>10} {len(per_seed):>5} {tn:>9.2f} {tb:>9.2f} {row['ratio']:>7.3f} "
              f"{same:>4}/{len(per_seed):<4} {max(diffs):>14.1e}", flush=True)
        atomic_write_json(args.json, {"command": " ".join(sys.argv), "threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                                      "rows": rows})
    return rows


if __name__ == "__main__":
    main()
