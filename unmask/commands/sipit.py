"""``unmask sipit``: recover a prompt from the hidden states of SmolLM2-135M at one layer."""

from __future__ import annotations

import argparse

HELP = "recover a prompt from the hidden states of a causal LM (SipIt)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="demonstration: compute the states of this text first, then recover it")
    src.add_argument("--states", metavar="H.npy", help="observed hidden states, shape (T, 576), all positions at --layer")
    parser.add_argument("--layer", type=int, required=True,
                        help="residual stream after this many blocks: 0 = embeddings, 30 = before the final norm")
    parser.add_argument("--policy", choices=["gradient", "bruteforce"], default="gradient")
    parser.add_argument("--eps", type=float, default=None,
                        help="verifier radius (absolute); default 1e-4 x the norm of each observed state")
    parser.add_argument("--noise", type=float, default=0.0,
                        help="with --text: add Gaussian noise of this L2 norm to each state before recovery")
    parser.add_argument("--max-candidates", type=int, default=None, help="give up at a position after this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON")


def run(args) -> int:
    import numpy as np

    from solver.io import atomic_write_json, load_array
    from unmask.models.smollm import load_smollm
    from unmask.sipit import BruteForcePolicy, GradientPolicy, check_states, sipit

    model = load_smollm()
    layer = model.check_layer(args.layer)
    original = None
    if args.text is not None:
        original = model.encode(args.text)
        if original.size == 0:
            from solver.errors import InvalidProblemError

            raise InvalidProblemError("--text is empty after tokenisation; give at least one character")
        states = np.asarray(model.layer_states(original, layer))
        if args.noise > 0:
            rng = np.random.default_rng(args.seed)
            z = rng.standard_normal(states.shape)
            states = (states + args.noise * z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
    else:
        states = load_array(args.states, "--states")
    states = check_states(model, states, layer)
    policy = GradientPolicy(seed=args.seed) if args.policy == "gradient" else BruteForcePolicy(seed=args.seed)
    res = sipit(model, states, layer, policy=policy, eps=args.eps, max_candidates=args.max_candidates, original=original)
    out = res.to_json(model.tokenizer)
    if original is not None:
        print(f"original : {out['original']!r}")
    print(f"recovered: {out['recovered']!r}")
    if res.complete:
        verdict = "exact" if res.exact else ("exact up to identical embeddings" if res.exact_up_to_duplicates else
                                             "complete (no original to compare)" if res.exact is None else "NOT exact")
    else:
        verdict = (f"FAILED at position {res.failed_position}: no token within eps={res.eps[res.failed_position]:.3g} "
                   f"after {res.candidates_per_position[-1]} candidates (states not from this model/layer, or too noisy)")
    print(f"result   : {verdict}")
    print(f"layer {layer}, policy {res.policy}, {len(states)} positions, {res.seconds:.1f} s, "
          f"candidates per position {res.candidates_per_position}, vocabulary explored {100 * res.vocab_fraction:.3f}%")
    if args.json:
        atomic_write_json(args.json, out)
    return 0 if res.complete else 1
