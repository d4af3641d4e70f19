"""The slice basis P (the orthogonal complement of the orbit tangent) two ways, each in a fresh process:
peak memory and CPU time.

    OPENBLAS_NUM_THREADS=1 python benchmarks/complement_basis_bench.py [--sizes 64x128,64x256]
        [--repeats 2] [--json benchmarks/results/complement_basis_bench.json]

For each one-head planted instance (d, n), seed 0, at its planted X: the orthonormal orbit tangent T
(dn, t), then P (dn, dn - t) by

- ``square_q``: ``np.ascontiguousarray(np.linalg.qr(T, "complete")[0][:, t:])``, what `slice_basis`
  and `recheck` did before: the whole (dn, dn) Q, then P copied out of it;
- ``complement_basis``: `solver.certificate.complement_basis` (the reflectors applied to the last
  dn - t rows of the identity by LAPACK dormqr; P only).

Each run is a child process (the methods alternate, ``--repeats`` times), so its peak RSS
(``ru_maxrss``, the JAX import and the instance included, the same for both) is the method's.
Prints CPU seconds of the basis alone, the peak in GiB, and the largest entrywise difference between
the two P; writes JSON (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from _common import size_pairs  # noqa: E402

METHODS = ("square_q", "complement_basis")


def child(d: int, n: int, method: str, out: str) -> None:
    import resource
    import time

    import numpy as np

    from solver.certificate import complement_basis
    from solver.newton import _orthonormal
    from solver.problem import planted_instance
    from solver.symmetry import symmetries

    problem, X = planted_instance(d, n, seed=0, heads=1)
    T = _orthonormal(symmetries(problem).orbit_tangent(np.asarray(X, np.float64)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.process_time()
    if method == "square_q":
        P = np.ascontiguousarray(np.linalg.qr(T, mode="complete")[0][:, T.shape[1]:])
    else:
        P = complement_basis(T)
    cpu = time.process_time() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    np.save(out + ".npy", P[:, :: max(1, P.shape[1] // 64)])  # a sample of columns, for the difference
    with open(out, "w") as f:
        json.dump({"d": d, "n": n, "method": method, "t": int(T.shape[1]), "cpu_seconds": cpu,
                   "peak_gib_before": before / 2**20, "peak_gib": peak / 2**20}, f)


def main(argv=None) -> None:
    import tempfile

    import numpy as np

    from solver.io import atomic_write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=size_pairs, default=size_pairs("64x128,64x256"), help="d x n pairs, one head")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default="benchmarks/results/complement_basis_bench.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.child:
        d, n, method, out = args.child.split(",")
        return child(int(d), int(n), method, out)
    rows = []
    print(f"{'(d, n)':>10} {'method':>17} {'CPU s':>7} {'peak GiB':>9} {'max |dP|':>9}")
    for d, n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats):
                for method in METHODS:
                    out = os.path.join(tmp, f"{method}_{r}.json")
                    subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f"{d},{n},{method},{out}"],
                                   check=True)
                    with open(out) as f:
                        row = json.load(f)
                    sample = np.load(out + ".npy")
                    ref = np.load(os.path.join(tmp, f"square_q_{r}.json.npy"))
                    row["max_abs_difference_to_square_q"] = float(np.abs(sample - ref).max())
                    row["repeat"] = r
                    rows.append(row)
                    print(f"{str((d, n)):>10} {method:>17} {row['cpu_seconds']:7.1f} {row['peak_gib']:9.2f} "
                          f"{row['max_abs_difference_to_square_q']:9.1e}")
    atomic_write_json(args.json, {"command": " ".join(["python", "benchmarks/complement_basis_bench.py", *(argv or sys.argv[1:])]),
                                  "rows": rows})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
