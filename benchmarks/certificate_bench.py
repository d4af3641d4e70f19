"""The two lower bounds on lambda_min behind the slice certificate, side by side, in one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/certificate_bench.py [--sizes 8x16,8x32,16x32] [--seeds 0,1]
        [--json benchmarks/results/certificate_bench.json]

For each one-head planted instance: ``recover(certify=False)``, the slice basis at its answer, then
``proofs_check.rigorous.slice_bounds`` (ball Hessian: dn HVPs in arb) and ``jacobian_slice_bounds``
(Gauss-Newton split, float64 balls) on the same box (half-width 1e-20 max(1, |X|_max), the first box
``slice_certificate`` tries) around the unpolished X. Prints seconds, the ratio, and both bounds
next to the float64 eigenvalue (not rigorous, for scale). The ball Hessian is skipped above
``--hessian-max`` (dn).

Then, for ``--la-sizes`` (default 32x64, one head), the interval-Jacobian path's two dense
factorisations, each against the one it replaced, in the same run: the slice basis (complete QR of
the orbit tangent against the SVD of ``I - T T^T``) and the V of ``sigma_min_sq_lower`` (eigh of
the Gram matrix against the SVD of the midpoint), with both bounds on ``sigma_min(J P)^2``; and the
slice Hessian's float64 factorisation before the polish (``eigvalsh`` and two LU solves against
`solver.certificate._slice_factor`, Cholesky and Lanczos on its inverse, and two back-substitutions),
with both estimates of its lambda_min. The first table also gives both bounds on the Gauss-Newton
remainder (`proofs_check.rigorous.remainder_bound`: row by row, and the one used).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _common import timed
from proofs_check.rigorous import _sigma_min_sq_with, jacobian_slice_bounds, jacobian_slice_enclosure, slice_bounds
from solver import certificate as certmod
from solver.certificate import slice_basis
from solver.io import atomic_write_json
from solver.newton import _orthonormal
from solver.problem import planted_instance
from solver.recover import recover
from solver.symmetry import symmetries


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8x16,8x32,16x32", help="d x n pairs, one head")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--hessian-max", type=int, default=512, help="largest dn for the ball Hessian")
    ap.add_argument("--la-sizes", default="32x64", help="d x n pairs for the factorisation table ('' to skip)")
    ap.add_argument("--json", default="benchmarks/results/certificate_bench.json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'(d, n)':>9} {'seed':>4} {'hessian s':>10} {'jacobian s':>10} {'ratio':>7} "
          f"{'l hessian':>10} {'l jacobian':>10} {'eig (float)':>11} {'rem rows':>9} {'rem used':>9}")
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
                   "ratio": th / tj, "l_hessian": lh, "l_jacobian": bj["l_lower"], "lambda_min_float": eig,
                   "remainder_rows": bj["hessian_remainder_rows"], "remainder": bj["hessian_remainder"]}
            rows.append(row)
            print(f"{f'({d}, {n})':>9} {seed:>4} {th:>10.2f} {tj:>10.2f} {row['ratio']:>7.1f} "
                  f"{lh:>10.3e} {bj['l_lower']:>10.3e} {eig:>11.3e} {row['remainder_rows']:>9.2e} "
                  f"{row['remainder']:>9.2e}", flush=True)
    la = linear_algebra(args.la_sizes, [int(s) for s in args.seeds.split(",")]) if args.la_sizes else []
    atomic_write_json(args.json, {"rows": rows, "linear_algebra": la, "box": "1e-20 max(1, |X|_max)",
                                  "threads": "OPENBLAS_NUM_THREADS as run"})
    print(f"wrote {args.json}")


def linear_algebra(sizes: str, seeds: list[int]) -> list[dict]:
    """The factorisation table (see the module docstring)."""
    rows = []
    print(f"\n{'(d, n)':>9} {'seed':>4} {'basis svd s':>11} {'basis qr s':>10} {'ratio':>6} "
          f"{'V svd s':>8} {'V eigh s':>8} {'ratio':>6} {'s2 (svd V)':>11} {'s2 (eigh V)':>11} "
          f"{'Hs eig+LU s':>11} {'Hs chol s':>9} {'ratio':>6} {'lam eigvalsh':>12} {'lam lanczos':>12}")
    for size in sizes.split(","):
        d, n = (int(v) for v in size.split("x"))
        for seed in seeds:
            problem, _ = planted_instance(d, n, heads=1, seed=seed)
            X = np.asarray(recover(problem, certify=False, validate=False).X)
            sym = symmetries(problem)
            T = _orthonormal(sym.orbit_tangent(X))
            dn, k = d * n, T.shape[1]
            P_svd, t_bsvd = timed(lambda: np.linalg.svd(np.eye(dn) - T @ T.T)[0][:, : dn - k])
            P, t_bqr = timed(lambda: slice_basis(problem, X, sym))
            box = 1e-20 * max(1.0, float(np.abs(X).max()))
            A, _ = jacobian_slice_enclosure(problem, X, np.zeros_like(X), P, box)
            Am = A[0]
            (s_svd, _), t_vsvd = timed(lambda: _sigma_min_sq_with(A, np.linalg.svd(Am, full_matrices=False)[2].T))
            (s_eig, info), t_veig = timed(lambda: _sigma_min_sq_with(A, np.linalg.eigh(Am.T @ Am)[1]))
            Hs = certmod.symmetrise(certmod._slice_hessian(problem, X, P))
            g = np.random.default_rng(seed).standard_normal(Hs.shape[0])

            def old():
                lam = float(np.linalg.eigvalsh(Hs)[0])
                np.linalg.solve(Hs, g), np.linalg.solve(Hs, g)
                return lam

            def new():
                import scipy.linalg as sl

                saved = certmod.SLICE_EIGVALSH_MAX
                certmod.SLICE_EIGVALSH_MAX = 0  # Lanczos whatever k
                try:
                    factor, lam, _ = certmod._slice_factor(Hs)
                finally:
                    certmod.SLICE_EIGVALSH_MAX = saved
                sl.cho_solve(factor, g), sl.cho_solve(factor, g)
                return lam

            lam_old, t_hold = timed(old)
            lam_new, t_hnew = timed(new)
            row = {"d": d, "n": n, "seed": seed, "k": k, "basis_svd_seconds": t_bsvd, "basis_qr_seconds": t_bqr,
                   "slice_eigvalsh_lu_seconds": t_hold, "slice_cholesky_lanczos_seconds": t_hnew,
                   "lambda_min_eigvalsh": lam_old, "lambda_min_lanczos": lam_new,
                   "V_svd_seconds": t_vsvd, "V_eigh_seconds": t_veig, "s2_svd_V": s_svd, "s2_eigh_V": s_eig,
                   "gram_offdiag_rel_eigh_V": info.get("gram_offdiag_rel"),
                   "basis_complement_defect": float(np.linalg.norm(P.T @ T)),
                   "basis_svd_complement_defect": float(np.linalg.norm(P_svd.T @ T))}
            rows.append(row)
            print(f"{f'({d}, {n})':>9} {seed:>4} {t_bsvd:>11.2f} {t_bqr:>10.2f} {t_bsvd / t_bqr:>6.1f} "
                  f"{t_vsvd:>8.2f} {t_veig:>8.2f} {t_vsvd / t_veig:>6.1f} {s_svd:>11.4e} {s_eig:>11.4e} "
                  f"{t_hold:>11.2f} {t_hnew:>9.2f} {t_hold / t_hnew:>6.1f} {lam_old:>12.5e} {lam_new:>12.5e}", flush=True)
    return rows


if __name__ == "__main__":
    main()
