"""``unmask attack minilm``: recover the input of all-MiniLM-L6-v2 from one layer's attention maps.

An observer holds attention maps, not text: ``--attention B.npy`` takes the maps themselves
(float32 or float64, shape (12, n, n)) and recovers from them alone. ``--text`` is the
demonstration: it computes the maps of the text first (float32, as a deployed model would),
then attacks them as if the text were unknown, and compares.
"""

from __future__ import annotations

import argparse
import sys

HELP = "recover the text fed into a real pretrained model from its attention"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", choices=["minilm"], help="the model: all-MiniLM-L6-v2")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="demonstration: compute the maps of this text, then attack them")
    src.add_argument("--attention", metavar="B.npy", help="observed attention maps of one layer, shape (12, n, n)")
    parser.add_argument("--layer", type=int, default=0, help="the layer the maps come from (0..5; default 0)")
    parser.add_argument("--try-certificate", action="store_true",
                        help="layers 1-5: also run solver.recover's certificate (7-14 min at n = 100; refused so far)")
    parser.add_argument("--beam", type=int, default=1, help="layer 0: prefixes kept per position (default 1)")
    parser.add_argument(
        "--weight-power", default="auto",
        help="layer 0: weight log-B entries by B**POWER (0 suits exact maps, 1-2 noisy ones); "
        "'auto' (default) tries 0, 1, 2 and keeps the tokens whose maps fit best, stopping once verified",
    )
    parser.add_argument("--save-attention", metavar="PATH", help="with --text: also write the maps to PATH (.npy)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")


def run(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from solver.io import atomic_save_npy, atomic_write_json, load_array
    from unmask.attacks import minilm as attack
    from unmask.models import minilm

    t0 = time.perf_counter()
    model = minilm.load()
    model.check_layer(args.layer)
    original_ids = None
    if args.text is not None:
        original_ids = model.encode(args.text)
        trace = model.forward(original_ids)
        B = trace.B[args.layer]
        if args.save_attention:
            atomic_save_npy(args.save_attention, B)
    else:
        B = load_array(args.attention, "--attention")
    B = attack.check_attention(B)

    if args.layer == 0:
        attack.scanner_for(model)  # one-off: the vocabulary's queries and keys
    setup = time.perf_counter() - t0
    if args.layer == 0:
        if args.weight_power == "auto":
            result = attack.decode_layer0_robust(B, model, beam=args.beam)
        else:
            try:
                power = float(args.weight_power)
            except ValueError:
                raise attack.InvalidProblemError(f"--weight-power must be a number or 'auto', got {args.weight_power!r}") from None
            result = attack.decode_layer0(B, model, beam=args.beam, weight_power=power)
        recovered, ids = result.text, result.ids
        record = {
            "model": "all-MiniLM-L6-v2",
            "layer": 0,
            "n_tokens": int(B.shape[1]),
            "recovered": recovered,
            "recovered_ids": ids.tolist(),
            "recovered_tokens": model.tokens(ids),
            "certificate": {
                "status": result.status,
                "max_abs_map_residual": result.residual,
                "tolerance": result.tolerance,
                "min_margin": float(np.min(result.margins[1:])) if len(ids) > 1 else None,
            },
            "seconds": result.seconds,
        }
    else:
        result = attack.recover_deep_layer(B, model, args.layer, certify=args.try_certificate)
        recovered, ids = None, None
        record = {
            "model": "all-MiniLM-L6-v2",
            "layer": args.layer,
            "n_tokens": int(B.shape[1]),
            "recovered": None,
            "certificate": {
                "status": result.status,
                "reason": result.reason,
                "init": result.init,
                "identifiable": result.identifiability.verdict,
                "log_domain_residual": result.residual,
                "unknowns": result.unknowns,
                "equations": result.equations,
                "method": result.method,
            },
            "seconds": result.seconds,
        }
    if original_ids is not None:
        record["original"] = model.decode(original_ids)
        record["original_ids"] = original_ids.tolist()
        if ids is not None:
            acc = float(np.mean(ids == original_ids))
            record["token_accuracy"] = acc
            record["exact"] = bool(np.array_equal(ids, original_ids))
        else:
            X = trace.X[args.layer]
            record["relative_error_X"] = float(np.linalg.norm(result.X - X) / np.linalg.norm(X))
            record["token_accuracy"] = None
            record["exact"] = False
    else:
        record["original"] = None
        record["token_accuracy"] = None
        record["exact"] = None

    out = sys.stdout
    print(f"model      all-MiniLM-L6-v2, layer {args.layer}, n = {B.shape[1]} tokens", file=out)
    print(f"original   {record['original'] if record['original'] is not None else '(unknown: maps given)'}", file=out)
    if args.layer == 0:
        print(f"recovered  {recovered}", file=out)
        if record["token_accuracy"] is not None:
            print(f"tokens     {record['token_accuracy']:.1%} exact ({'whole text exact' if record['exact'] else 'not exact'})", file=out)
        cert = record["certificate"]
        print(
            f"certificate {cert['status']} (max |B(recovered) - B| = {cert['max_abs_map_residual']:.2e}, "
            f"tolerance {cert['tolerance']:.0e}; smallest runner-up margin {cert['min_margin']:.3g})",
            file=out,
        )
    else:
        print(f"recovered  X ({B.shape[1]} columns); text is not decodable from layer {args.layer} maps alone", file=out)
        if "relative_error_X" in record:
            print(f"rel. error {record['relative_error_X']:.3g}  ||X_rec - X|| / ||X||", file=out)
        cert = record["certificate"]
        print(
            f"certificate {cert['status']} ({cert['method']}, init {cert['init']}; log-domain residual "
            f"{cert['log_domain_residual']:.2e}; {cert['unknowns']} unknowns, {cert['equations']} equations; "
            f"identifiable: {cert['identifiable']})",
            file=out,
        )
        if cert["reason"]:
            print(f"why        {cert['reason']}", file=out)
    record["setup_seconds"] = setup
    print(f"time       {record['seconds']:.2f} s (plus {setup:.2f} s loading the model and tables)", file=out)
    if args.json:
        atomic_write_json(args.json, record)
    return 0
