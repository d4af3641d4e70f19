"""``unmask collisions``: minimum distance between the last-token states of many distinct prompts."""

from __future__ import annotations

import argparse

HELP = "minimum distance between the hidden states of many prompts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, required=True, help="number of distinct prompts (half natural, half random)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len", type=int, default=16, help="longest prompt in tokens")
    parser.add_argument("--extension-pairs", type=int, default=0,
                        help="run the one-token-extension test on this many closest pairs at layer 1 (about 10 s each)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON")
    parser.add_argument("--png", metavar="PATH", default=None,
                        help="histogram of nearest-neighbour distances (default: next to --json, else collisions.png)")


def histogram(path, states: dict, title: str) -> None:
    """Histogram of each prompt's nearest-neighbour distance, one panel per layer (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from solver.io import save_figure
    from unmask.collisions import nearest_neighbour_distances

    fig, axes = plt.subplots(1, len(states), figsize=(4 * len(states), 3.2))
    for ax, (layer, S) in zip(np.atleast_1d(axes), states.items()):
        d = nearest_neighbour_distances(S)
        ax.hist(d, bins=np.logspace(np.log10(max(d.min(), 1e-6)), np.log10(d.max()), 50))
        ax.set_xscale("log")
        ax.set_title(f"layer {layer}: min {d.min():.3g}")
        ax.set_xlabel("nearest-neighbour L2 distance")
    axes = np.atleast_1d(axes)
    axes[0].set_ylabel("prompts")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)


def run(args) -> int:
    from pathlib import Path

    from solver.errors import InvalidProblemError
    from solver.io import atomic_write_json
    from unmask.collisions import PAPER_MIN_DISTANCES, collision_test, extension_test
    from unmask.models.smollm import load_smollm

    if args.prompts < 2:
        raise InvalidProblemError(f"--prompts must be at least 2, got {args.prompts}")
    model = load_smollm()
    res = collision_test(model, args.prompts, seed=args.seed, max_len=args.max_len)
    layers = res["layers"]
    print(f"{res['n_prompts']} distinct prompts, {res['n_pairs']:.3g} pairs, {res['seconds']['total']:.1f} s "
          f"(forward {res['seconds']['forward']:.1f} s, search {res['seconds']['search']:.1f} s)")
    print(f"{'layer':>6} {'min distance':>13} {'median |h|':>11}   closest pair")
    for l in layers:
        d, i, j = res["closest_pairs"][l][0]
        print(f"{l:>6} {d:>13.4g} {res['median_norm'][l]:>11.4g}   {model.decode(res['prompts'][i])!r} / {model.decode(res['prompts'][j])!r}")
    for name, (a, b, c) in PAPER_MIN_DISTANCES.items():
        print(f"paper {name}: {a} / {b} / {c} (layer 1 / L/2 / L, 100k prompts)")
    ext = []
    for d, i, j in res["closest_pairs"][layers[0]][: args.extension_pairs]:
        e = extension_test(model, res["prompts"][i], res["prompts"][j], layers[0])
        e.update(pair_distance=d, prompts=[model.decode(res["prompts"][i]), model.decode(res["prompts"][j])])
        ext.append(e)
        print(f"extension test, layer {layers[0]}: pair at {d:.4g} -> min over {e['n_extensions']} one-token "
              f"extensions {e['min_same_token_distance']:.4g}")
    png = args.png or (str(Path(args.json).with_suffix(".png")) if args.json else "collisions.png")
    histogram(png, res["states"], f"SmolLM2-135M, {res['n_prompts']} prompts")
    print(f"histogram: {png}")
    if args.json:
        atomic_write_json(args.json, {
            "model": "SmolLM2-135M-Instruct Q4_1",
            "n_prompts": res["n_prompts"],
            "n_pairs": res["n_pairs"],
            "min_distance": {str(l): res["min_distance"][l] for l in layers},
            "median_norm": {str(l): res["median_norm"][l] for l in layers},
            "closest_pairs": {str(l): [{"distance": d, "prompts": [model.decode(res["prompts"][i]), model.decode(res["prompts"][j])]}
                                       for d, i, j in res["closest_pairs"][l]] for l in layers},
            "extension_test": ext,
            "paper_min_distances": PAPER_MIN_DISTANCES,
            "seconds": res["seconds"],
        })
    return 0
