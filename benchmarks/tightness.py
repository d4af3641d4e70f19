"""Tightness of every lemma: worst adversarial ratio true / bound over a grid of regions.

    python benchmarks/tightness.py [--sizes 4x8,8x16,16x32] [--R 0.5,1,2] [--json benchmarks/results/tightness.json]

Regions: 2 heads, omega = 2, mu = 0.5, gamma = 1, gamma_max = 2 (the demo family).
"""

from __future__ import annotations

import argparse

from proofs_check.checker import check
from proofs_check.region import Region
from solver.io import atomic_write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4x8,8x16,16x32")
    ap.add_argument("--R", default="0.5,1,2")
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--json", default="benchmarks/results/tightness.json")
    args = ap.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        d, n = (int(s) for s in size.split("x"))
        for R in (float(r) for r in args.R.split(",")):
            region = Region(d=d, n=n, heads=2, R=R, omega=2.0, mu=0.5, gamma=1.0, gamma_max=2.0)
            rep = check(region, instances=args.instances, starts=4, steps=40, progress=False)
            row = {"d": d, "n": n, "R": R, "ok": rep.ok, "seconds": rep.seconds,
                   "ratios": {r.name: max(r.worst_random_ratio, r.worst_adversarial_ratio) for r in rep.lemmas}}
            rows.append(row)
            print(f"d={d:2d} n={n:2d} R={R:3.1f} {'OK' if rep.ok else 'VIOLATED'}  " +
                  "  ".join(f"{k}={v:.3f}" for k, v in row["ratios"].items()), flush=True)
    atomic_write_json(args.json, {"rows": rows})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
