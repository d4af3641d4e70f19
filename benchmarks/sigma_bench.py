"""The streamed lower bounds on ``sigma_min(J P)^2`` of the interval-Jacobian certificate, side by
side: time, peak memory and the bound, each in a fresh process.

    OPENBLAS_NUM_THREADS=1 python benchmarks/sigma_bench.py [--sizes 32x64,64x128] [--seed 0]
        [--methods eigh,cholesky,lifted] [--json benchmarks/results/sigma_bench.json]

For each one-head planted instance (d, n): the slice basis P at the planted X (an exact fit), then
``proofs_check.rigorous.jacobian_slice_bounds`` streamed by the blocks `jacobian_streaming_plan`
picks under the host budget (at least two blocks, so both methods stream), on the first box
``slice_certificate`` tries (half-width 1e-20 max(1, |X|_max)), with ``sigma="eigh"`` (two passes
over ``J P``, ``eigh`` of the Gram matrix: about seven (k, k) arrays) and ``sigma="cholesky"`` (one
pass, shifted Cholesky factorisations: one) and ``lifted`` (`tangent_slice_bounds`: no P and no ``J P``,
``J^T J`` in closed form with the orbit tangent lifted, on the slice orthogonal to the tangent; one
(dn, dn) array; the basis P is made for every method, outside the timing). Each (size, method) runs in its own child process, so
the peak RSS (``os.wait4``) is that method's, setup included (the same setup for both); the methods
alternate within a size. The child keeps freed memory (`solver.memory.keep_freed_memory`), as
`unmask` and recover_bench.py do. Prints seconds for the bound alone, wall seconds, peak GiB, the bound, and
the ratios Cholesky over eigh and lifted over Cholesky; writes JSON. ``--skip-eigh-above K`` skips the eigh method above
dn = K (one head (64, 256), k = 16352: its seven (k, k) arrays are about 15 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def child(d: int, n: int, seed: int, method: str, out: str) -> None:
    """One measurement in this (fresh) process; writes its row to ``out``."""
    import numpy as np

    from proofs_check.rigorous import jacobian_slice_bounds, jacobian_streaming_plan, tangent_slice_bounds
    from solver.certificate import slice_basis
    from solver.memory import host_budget, keep_freed_memory
    from solver.problem import planted_instance
    from solver.symmetry import symmetries

    kept = keep_freed_memory()  # as `unmask` and recover_bench.py do
    problem, X = planted_instance(d, n, seed=seed, heads=1)
    X = np.asarray(X, np.float64)
    sym = symmetries(problem)
    P = slice_basis(problem, X, sym)
    k = P.shape[1]
    rows, need = jacobian_streaming_plan(problem, d * n, host_budget())
    if not rows:  # whole, or too large: stream anyway, in at least two blocks
        rows = max(1, n // 2)
    box = 1e-20 * max(1.0, float(np.abs(X).max()))
    t = time.perf_counter()
    if method == "lifted":  # (its own slice, the tangent's orthogonal complement: P is not used)
        b = tangent_slice_bounds(problem, X, np.zeros_like(X), sym.orbit_tangent(X), box)
    else:
        b = jacobian_slice_bounds(problem, X, np.zeros_like(X), P, box, rows_per_block=rows, sigma=method)
    seconds = time.perf_counter() - t
    row = {"d": d, "n": n, "seed": seed, "k": int(k), "method": method, "rows_per_block": int(rows),
           "bound_seconds": seconds, "sigma_min_sq_lower": b["sigma_min_sq_lower"], "l_lower": b["l_lower"],
           "sigma_from": b.get("sigma_from"), "gram_lambda_estimate": b.get("gram_lambda_estimate"),
           "gram_rounding": b.get("gram_rounding"), "cholesky": b.get("cholesky"),
           "jacobian_rad_norm": b.get("jacobian_rad_norm"), "keep_freed_memory": kept}
    with open(out, "w") as f:
        json.dump(row, f)


def one_run(d: int, n: int, seed: int, method: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "row.json"), os.path.join(tmp, "stderr")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{d},{n},{seed},{method},{out}"]
        t = time.perf_counter()
        with open(err, "w") as ferr:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=ferr)
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0 or not os.path.exists(out):
            with open(err) as f:
                tail = f.read()[-2000:]
            raise SystemExit(f"child failed: {' '.join(cmd)}\n{tail}")
        with open(out) as f:
            row = json.load(f)
    row.update({"wall_seconds": wall, "user_seconds": usage.ru_utime, "system_seconds": usage.ru_stime,
                "peak_gib": usage.ru_maxrss * 1024 / 2**30})
    return row


def main(argv=None):
    from solver.io import atomic_write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="32x64,64x128", help="d x n pairs, one head")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default="eigh,cholesky")
    ap.add_argument("--skip-eigh-above", type=int, default=10_000, help="largest dn for the eigh method")
    ap.add_argument("--json", default="benchmarks/results/sigma_bench.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        d, n, seed, method, out = args.child.split(",", 4)
        child(int(d), int(n), int(seed), method, out)
        return
    methods = [m for m in args.methods.split(",") if m]
    if not methods or any(m not in ("eigh", "cholesky", "lifted") for m in methods) or args.seed < 0:
        ap.error("--methods takes eigh, cholesky and/or lifted; --seed must be >= 0")
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    rows, ratios = [], []
    print(f"{'(d, n)':>10} {'k':>6} {'method':>9} {'bound s':>8} {'wall s':>7} {'peak GiB':>8} {'sigma_min^2 >=':>15}",
          flush=True)
    for d, n in sizes:
        k_est = d * n  # (the slice dimension is dn less the group's: 8150 of 8192 at (64, 128))
        got = {}
        for method in methods:
            if method == "eigh" and k_est > args.skip_eigh_above:
                print(f"{f'({d}, {n})':>10} {'':>6} {'eigh':>9}  skipped: dn above --skip-eigh-above", flush=True)
                continue
            row = one_run(d, n, args.seed, method)
            rows.append(row)
            got[method] = row
            print(f"{f'({d}, {n})':>10} {row['k']:>6} {method:>9} {row['bound_seconds']:>8.1f} "
                  f"{row['wall_seconds']:>7.1f} {row['peak_gib']:>8.2f} {row['sigma_min_sq_lower']:>15.4e}", flush=True)
        for top, bottom in (("cholesky", "eigh"), ("lifted", "cholesky")):
            if top in got and bottom in got:
                e, c = got[bottom], got[top]
                r = {"d": d, "n": n, "ratio": f"{top} / {bottom}", "bound_seconds": c["bound_seconds"] / e["bound_seconds"],
                     "peak": c["peak_gib"] / e["peak_gib"],
                     "sigma_min_sq_lower": c["sigma_min_sq_lower"] / e["sigma_min_sq_lower"]}
                ratios.append(r)
                print(f"{f'({d}, {n})':>10} {top} / {bottom}: bound time {r['bound_seconds']:.2f}, peak {r['peak']:.2f}, "
                      f"bound {r['sigma_min_sq_lower']:.3f}", flush=True)
        atomic_write_json(args.json, {"command": " ".join(["python", "benchmarks/sigma_bench.py", *sys.argv[1:]]),
                                      "threads": os.environ.get("OPENBLAS_NUM_THREADS", "as it comes"),
                                      "rows": rows, "ratios": ratios})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
