"""Does perturbing the attention maps defend all-MiniLM-L6-v2's input? Layer 0, text recovery.

    python benchmarks/minilm_defences.py                  # about 20 min on 2 busy cores
    python benchmarks/minilm_defences.py --sentences 4    # quick look

Perturbations of the float32 layer-0 maps (all rows renormalised afterwards):
additive Gaussian noise N(0, sigma^2) on every entry, clipped at 0; uniform quantisation of
the probabilities to 2^bits - 1 levels; top-k truncation (the k largest entries of each row
kept, the rest zeroed). Zeros carry no log-domain information and get weight 0.
The attacker decodes with entry weights B^0, B^1 and B^2 and keeps the decoding whose maps
fit the observed ones best (``decode_layer0_robust``); the per-weighting rates are kept too.
Prints a table, writes benchmarks/results/minilm_defences.json and minilm_defences.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from solver.io import atomic_write, atomic_write_json
from unmask.attacks import minilm as attack
from unmask.attacks.sentences import SENTENCES
from unmask.models import minilm

RESULTS = Path(__file__).parent / "results"

SETTINGS = (
    [("none", 0)]
    + [("gaussian", s) for s in (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2)]
    + [("quantise", b) for b in (8, 6, 4, 3, 2)]
    + [("top_k", k) for k in (16, 8, 4, 2, 1)]
)


def perturb(B: np.ndarray, kind: str, size, rng) -> np.ndarray:
    if kind == "none":
        return B
    if kind == "gaussian":
        return attack.gaussian_noise(B, size, rng)
    if kind == "quantise":
        return attack.quantise(B, int(size))
    return attack.top_k(B, int(size))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=10, help="natural sentences (default 10, spread over the set)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    model = minilm.load()
    step = max(1, len(SENTENCES) // args.sentences)
    texts = list(SENTENCES[::step][: args.sentences])
    rng = np.random.default_rng(0)
    maps = []
    for text in texts:
        ids = model.encode(text)
        maps.append((ids, model.forward(ids).B[0].astype(np.float64)))
    attack.decode_layer0(maps[0][1], model)  # compile the scan once
    rows = []
    started = time.time()
    for kind, size in SETTINGS:
        per = {"robust": [], 0.0: [], 1.0: [], 2.0: []}
        secs, zeros = [], []
        for ids, B in maps:
            P = perturb(B, kind, size, rng)
            zeros.append(float((P == 0).mean()))
            t = time.perf_counter()
            runs = {p: attack.decode_layer0(P, model, weight_power=p) for p in (0.0, 1.0, 2.0)}
            best = min(runs.values(), key=lambda r: r.fit)  # decode_layer0_robust without early stop
            secs.append(time.perf_counter() - t)
            for key, r in [("robust", best), *runs.items()]:
                per[key].append((float(np.mean(r.ids == ids)), bool(np.array_equal(r.ids, ids)), len(ids)))

        def rates(items):
            tok = sum(a * n for a, _, n in items) / sum(n for _, _, n in items)
            return tok, float(np.mean([e for _, e, _ in items]))

        row = {"perturbation": kind, "size": size, "zero_fraction": float(np.mean(zeros)), "seconds_per_sentence": float(np.mean(secs))}
        for key, items in per.items():
            tok, sent = rates(items)
            name = key if key == "robust" else f"power{int(key)}"
            row[f"{name}_token_rate"], row[f"{name}_sentence_rate"] = tok, sent
        rows.append(row)
        print(
            f"{kind:<9}{size!s:>8}  zeros {row['zero_fraction']:5.1%}  tokens {row['robust_token_rate']:7.2%}  "
            f"sentences {row['robust_sentence_rate']:7.2%}   (B^0 {row['power0_token_rate']:.2f}, B^1 {row['power1_token_rate']:.2f}, "
            f"B^2 {row['power2_token_rate']:.2f})  {row['seconds_per_sentence']:.1f} s",
            flush=True,
        )
    record = {
        "model": "all-MiniLM-L6-v2, layer 0, float32 maps then perturbed",
        "sentences": texts,
        "tokens": int(sum(len(i) for i, _ in maps)),
        "rows": rows,
        "seconds_total": time.time() - started,
    }
    atomic_write_json(args.out / "minilm_defences.json", record)
    plot(rows, args.out / "minilm_defences.png")
    print(f"wrote {args.out / 'minilm_defences.json'} and minilm_defences.png")
    return 0


def plot(rows, path: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    panels = [
        ("gaussian", "additive noise sigma on B", True),
        ("quantise", "bits per probability", False),
        ("top_k", "entries kept per row (k)", True),
    ]
    for ax, (kind, label, logx) in zip(axes, panels):
        sel = [r for r in rows if r["perturbation"] == kind]
        x = [r["size"] for r in sel]
        ax.plot(x, [r["robust_token_rate"] for r in sel], "o-", label="exact tokens")
        ax.plot(x, [r["robust_sentence_rate"] for r in sel], "s--", label="exact sentences")
        if logx:
            ax.set_xscale("log")
        if kind != "gaussian":
            ax.invert_xaxis()
        ax.set_xlabel(label)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("recovery rate (layer 0)")
    axes[0].legend(loc="lower left")
    fig.suptitle("all-MiniLM-L6-v2: text recovered from perturbed layer-0 attention maps")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


if __name__ == "__main__":
    raise SystemExit(main())
