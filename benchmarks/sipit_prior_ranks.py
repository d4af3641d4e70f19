"""Where the true token ranks under SipIt's two cheap orderings, before any candidate is verified.

    OPENBLAS_NUM_THREADS=1 python benchmarks/sipit_prior_ranks.py [--layer 30] [--prompts 20]

For each position t >= 1 of the benchmark prompts (`sipit_bench.prompts_20`: natural and
random-token prompts alternating): the rank of the true token among the vocabulary embeddings
nearest to the read-out's prediction of the observed state (`StateReadout`), and among the
model's own next-token logits after the true prefix (`SmolLM.logits`; at the last layer these
are what `unmask.sipit._PriorGate` reads off ``H[t-1]``). Prints a table and writes
benchmarks/results/sipit_prior_ranks.json.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sipit_prior_ranks.json"))
    args = ap.parse_args()

    from sipit_bench import prompts_20

    from solver.io import atomic_write_json
    from unmask.models.smollm import load_smollm
    from unmask.sipit import _context

    model = load_smollm()
    readout = _context(model, args.layer).readout()
    E = np.asarray(model.weights.embed, np.float64)
    esq = np.sum(E * E, axis=1)
    ranks: dict[str, dict[str, list[int]]] = {k: {"natural": [], "random": []} for k in ("readout", "model_prior")}
    for i, ids in enumerate(prompts_20(model, args.prompts)):
        kind = "natural" if i % 2 == 0 else "random"
        H = np.asarray(model.layer_states(ids, args.layer))
        logits = np.asarray(model.logits(ids))
        for t in range(1, len(ids)):
            score = esq - 2 * E @ readout.predict(H[t], t).astype(np.float64)
            ranks["readout"][kind].append(int(np.sum(score < score[ids[t]])))
            ranks["model_prior"][kind].append(int(np.sum(logits[t - 1] > logits[t - 1][ids[t]])))
    rows = []
    print(f"layer {args.layer}, {args.prompts} prompts, positions 1-19")
    print(f"{'ordering':12s} {'prompts':8s} {'top 64':>7s} {'top 256':>8s} {'top 1024':>9s} {'median rank':>12s}")
    for name, by_kind in ranks.items():
        for kind, r in by_kind.items():
            r = np.asarray(r)
            row = {"ordering": name, "prompts": kind, "positions": int(r.size), "top64": float(np.mean(r < 64)),
                   "top256": float(np.mean(r < 256)), "top1024": float(np.mean(r < 1024)),
                   "median_rank": float(np.median(r))}
            rows.append(row)
            print(f"{name:12s} {kind:8s} {row['top64']:7.0%} {row['top256']:8.0%} {row['top1024']:9.0%} "
                  f"{row['median_rank']:12.0f}")
    atomic_write_json(args.out, {"layer": args.layer, "n_prompts": args.prompts,
                                 "command": f"python benchmarks/sipit_prior_ranks.py --layer {args.layer} "
                                            f"--prompts {args.prompts}", "rows": rows})


if __name__ == "__main__":
    main()
