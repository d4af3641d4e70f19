"""`recheck`'s comparison of the ball ``J P`` with the reference transcription, two ways, in one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/recheck_compare_bench.py [--sizes 16x64,32x128,64x128]
        [--heads 1] [--seed 0] [--json benchmarks/results/recheck_compare_bench.json]

An interval-Jacobian certificate's recheck compares its own ball ``J P`` (the formulas of
``proofs_check.rigorous``) with the reference attention maps, block by block as the bound streams
it. The whole comparison (``jax.jacfwd`` of the reference, an (H n^2, dn) Jacobian, times P for every
block: the baseline, as recheck did it up to e696dbb) against what recheck does now: ``jax.jvp`` along
``COMPARE_DIRECTIONS`` random slice directions ``P z`` against the ball product ``(J P) z``. Same
planted X (an exact fit), same slice basis, same blocks (`jacobian_streaming_plan` under the host
budget); the block generation itself is not timed. Prints seconds, the ratio, and each comparison's
relative difference (rounding level for both), and writes JSON after each size.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from _common import size_pairs
from proofs_check import midrad
from proofs_check import reference as ref
from proofs_check.recheck import COMPARE_DIRECTIONS, reference_slice_directions
from proofs_check.rigorous import _jacobian_slice_rows, _jacobian_slice_setup, jacobian_streaming_plan
from solver.certificate import slice_basis
from solver.io import atomic_write_json
from solver.memory import host_budget
from solver.problem import planted_instance
from solver.symmetry import symmetries


def compare_both(problem, X, P, rows_per_block):
    """``(seconds_whole, seconds_directions, rel_diff_whole, rel_diff_directions)`` on the same blocks."""
    d, n = X.shape
    heads, _, _ = _jacobian_slice_setup(problem, X, np.zeros((2, d, n)), P, 1e-20)
    t = time.perf_counter()
    J_ref = np.concatenate([np.asarray(jax.jacfwd(ref.attention)(X, problem.W[h], problem.U[h])).reshape(n * n, d * n)
                            for h in range(problem.heads)])
    t_whole = time.perf_counter() - t
    t = time.perf_counter()
    Z, ref_JPZ = reference_slice_directions(problem, X, P)
    t_dirs = time.perf_counter() - t
    sq = np.zeros(4)  # diff and reference, whole then directions
    for rows, ball in _jacobian_slice_rows(heads, P, n, rows_per_block):
        t = time.perf_counter()
        JP = J_ref[rows] @ P
        sq[:2] += float(np.sum((ball[0] - JP) ** 2)), float(np.sum(JP**2))
        t_whole += time.perf_counter() - t
        t = time.perf_counter()
        mid, rad = midrad.matmul(ball, (Z, None))
        midrad.norm_upper((rad, None))
        sq[2:] += float(np.sum((mid - ref_JPZ[rows]) ** 2)), float(np.sum(ref_JPZ[rows] ** 2))
        t_dirs += time.perf_counter() - t
    r = np.sqrt(sq)
    return t_whole, t_dirs, float(r[0] / r[1]), float(r[2] / r[3])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=size_pairs, default=size_pairs("16x64,32x128,64x128"), help="d x n pairs")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="benchmarks/results/recheck_compare_bench.json")
    args = ap.parse_args(argv)
    if args.heads < 1 or args.seed < 0:
        ap.error("--heads must be >= 1 and --seed >= 0")
    rows = []
    print(f"{'d':>4} {'n':>4} {'k':>6} {'rows/block':>10} {'whole s':>8} {'dirs s':>7} {'ratio':>6} "
          f"{'rel diff whole':>14} {'rel diff dirs':>13}", flush=True)
    for d, n in args.sizes:
        problem, X = planted_instance(d, n, seed=args.seed, heads=args.heads)
        X = np.asarray(X, np.float64)
        P = slice_basis(problem, X, symmetries(problem))
        rows_per_block, _ = jacobian_streaming_plan(problem, d * n, host_budget())
        if rows_per_block == 0:
            print(f"{d:4d} {n:4d}: J P does not fit the host budget even streamed; skipped", flush=True)
            continue
        t_whole, t_dirs, r_whole, r_dirs = compare_both(problem, X, P, rows_per_block)
        row = {"d": d, "n": n, "heads": args.heads, "seed": args.seed, "k": int(P.shape[1]),
               "rows_per_block": rows_per_block, "directions": COMPARE_DIRECTIONS, "whole_seconds": t_whole,
               "directions_seconds": t_dirs, "ratio": t_whole / t_dirs, "relative_difference_whole": r_whole,
               "relative_difference_directions": r_dirs, "jacobian_bytes": 8 * args.heads * n * n * d * n}
        rows.append(row)
        print(f"{d:4d} {n:4d} {row['k']:6d} {str(rows_per_block):>10} {t_whole:8.2f} {t_dirs:7.2f} "
              f"{t_whole / t_dirs:6.1f} {r_whole:14.1e} {r_dirs:13.1e}", flush=True)
        atomic_write_json(args.json, {"command": " ".join(sys.argv), "rows": rows})  # after each size


if __name__ == "__main__":
    main()
