"""The float64 slice Hessian ``P^T H P`` of the slice certificate above ``DENSE_HESSIAN_MAX``, two ways,
in one run: ``solver.certificate._slice_hessian`` (the upper triangle by column blocks, the rest its
transpose) against the full product ``P^T (H P)`` it replaced (``H P`` from the same generated HVP
blocks, then one gemm).

    OPENBLAS_NUM_THREADS=1 python benchmarks/slice_hessian_bench.py [--sizes 64x128] [--seeds 0]
        [--repeats 2] [--json benchmarks/results/slice_hessian_bench.json]

For each one-head planted instance, at its planted X (an exact fit), P is ``slice_basis``. Reports the
CPU seconds of each way (the fastest of ``--repeats``, the ways alternating; both include the same
k / 256 calls of 256 HVPs (k = P's columns) and their JIT compilation), their ratio, and the relative Frobenius difference of
the two symmetrised results. Prints a table; writes JSON atomically.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from _common import size_pairs  # noqa: E402

import solver.certificate as certmod  # noqa: E402
from solver import planted_instance  # noqa: E402
from solver.io import atomic_write_json  # noqa: E402
from solver.rounding import symmetrise  # noqa: E402
from solver.symmetry import symmetries  # noqa: E402


def full_product(problem, X, P) -> np.ndarray:
    """The replaced way: all of ``H P`` from HVP blocks, then ``P^T (H P)``."""
    return P.T @ certmod._hvp_rows(problem, X, P.shape[1], lambda j, b: P[:, j:j + b].T).T


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=size_pairs, default="64x128", help="DxN,... (one head; dn above DENSE_HESSIAN_MAX to matter)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default="benchmarks/results/slice_hessian_bench.json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'(d, n)':>10} {'seed':>4} {'k':>6} {'blocks s':>9} {'full s':>8} {'ratio':>6} {'rel diff':>9}")
    for d, n in args.sizes:
        if d * n <= certmod.DENSE_HESSIAN_MAX:
            raise SystemExit(f"dn = {d * n} is at most DENSE_HESSIAN_MAX = {certmod.DENSE_HESSIAN_MAX}: the dense path runs")
        for seed in (int(s) for s in args.seeds.split(",")):
            problem, X = planted_instance(d, n, heads=1, seed=seed)
            X = np.asarray(X, np.float64)
            P = certmod.slice_basis(problem, X, symmetries(problem))
            seconds = {"blocks": [], "full": []}
            out = {}
            for _ in range(args.repeats):
                for name, fn in (("blocks", certmod._slice_hessian), ("full", full_product)):
                    out.pop(name, None)
                    t = time.process_time()
                    out[name] = fn(problem, X, P)
                    seconds[name].append(time.process_time() - t)
            a, b = symmetrise(out["blocks"]), symmetrise(out["full"])
            row = {"d": d, "n": n, "seed": seed, "k": P.shape[1], "blocks_seconds": min(seconds["blocks"]),
                   "full_seconds": min(seconds["full"]), "all_seconds": seconds,
                   "rel_diff": float(np.linalg.norm(a - b) / np.linalg.norm(b))}
            row["ratio"] = row["blocks_seconds"] / row["full_seconds"]
            rows.append(row)
            print(f"{f'({d}, {n})':>10} {seed:>4} {row['k']:>6} {row['blocks_seconds']:>9.1f} {row['full_seconds']:>8.1f} "
                  f"{row['ratio']:>6.2f} {row['rel_diff']:>9.1e}", flush=True)
            del out, a, b, P
            atomic_write_json(args.json, {"command": " ".join(sys.argv), "threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                                          "rows": rows})
    return rows


if __name__ == "__main__":
    main()
