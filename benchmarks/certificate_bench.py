"""The two lower bounds on lambda_min behind the slice certificate, side by side, in one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/certificate_bench.py [--sizes 8x16,8x32,16x32] [--seeds 0,1]
        [--json benchmarks/results/certificate_bench.json]

For each one-head planted instance: ``recover(certify=False)``, the slice basis at its answer, then
``proofs_check.rigorous.slice_bounds`` (ball Hessian: dn HVPs in arb) and ``jacobian_slice_bounds``
(Gauss-Newton split, float64 balls) on the same box (half-width 1e-20 max(1, |X|_max), the first box
``slice_certificate`` tries) around the unpolished X. Prints seconds, the ratio, and both bounds
next to the float64 eigenvalue (not rigorous, for scale). The ball Hessian is skipped above
``--hessian-max`` (dn).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from proofs_check.rigorous import jacobian_slice_bounds, slice_bounds
from solver.certificate import slice_basis
from solver.io import atomic_write_json
from solver.problem import planted_instance
from solver.recover import recover
from solver.symmetry import symmetries


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8x16,8x32,16x32", help="d x n pairs, one head")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--hessian-max", type=int, default=512, help="largest dn for the ball Hessian")
    ap.add_argument("--json", default="benchmarks/results/certificate_bench.json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'(d, n)':>9} {'seed':>4} {'hessian s':>10} {'jacobian s':>10} {'ratio':>7} "
          f"{'l hessian':>10} {'l jacobian':>10} {'eig (float)':>11}")
    for size in args.sizes.split(","):
        d, n = (int(v) for v in size.split("x"))
        for seed in (int(s) for s in args.seeds.split(",")):
            problem, _ = planted_instance(d, n, heads=1, seed=seed)
            X = np.asarray(recover(problem, certify=False, validate=False).X)
            sym = symmetries(problem)
            P = slice_basis(problem, X, sym)
            box = 1e-20 * max(1.0, float(np.abs(X).max()))
            dX = np.zeros_like(X)
            t = time.perf_counter()
            bj = jacobian_slice_bounds(problem, X, dX, P, box)
            tj = time.perf_counter() - t
            th, lh = float("nan"), float("nan")
            if d * n <= args.hessian_max:
                t = time.perf_counter()
                lh = slice_bounds(problem, X, dX, P, box)["l_lower"]
                th = time.perf_counter() - t
            Hs = P.T @ np.asarray(problem.hessian(X)).reshape(d * n, d * n) @ P
            eig = float(np.linalg.eigvalsh((Hs + Hs.T) / 2)[0])
            row = {"d": d, "n": n, "seed": seed, "hessian_seconds": th, "jacobian_seconds": tj,
                   "ratio": th / tj, "l_hessian": lh, "l_jacobian": bj["l_lower"], "lambda_min_float": eig}
            rows.append(row)
            print(f"{f'({d}, {n})':>9} {seed:>4} {th:>10.2f} {tj:>10.2f} {row['ratio']:>7.1f} "
                  f"{lh:>10.3e} {bj['l_lower']:>10.3e} {eig:>11.3e}", flush=True)
    atomic_write_json(args.json, {"rows": rows, "box": "1e-20 max(1, |X|_max)", "threads": "OPENBLAS_NUM_THREADS as run"})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
