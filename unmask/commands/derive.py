"""``unmask derive``: run the symbolic derivation and write (or check) the generated JAX code."""

from __future__ import annotations

import sys
import time

HELP = "derive the loss symbolically and (re)generate solver/_generated.py"


def add_arguments(p):
    p.add_argument("--check", action="store_true", help="exit 1 if solver/_generated.py differs from a fresh generation")
    p.add_argument("--show", action="store_true", help="print the derived formulas and lemma constants in readable form")
    p.add_argument("--prove", type=int, metavar="DN", default=0,
                   help="also prove the closed forms exactly for every (d, n) with d*n <= DN (randomised Schwartz-Zippel)")


def run(args) -> int:
    from derivations import codegen

    t0 = time.perf_counter()
    if args.show:
        from derivations.lemmas import describe_lemmas
        from derivations.show import describe

        print(describe())
        print()
        print(describe_lemmas())
    if args.check:
        ok, message = codegen.check()
        print(message, file=sys.stdout if ok else sys.stderr)
        if not ok:
            return 1
    elif not args.show:
        from solver.io import atomic_write

        path = atomic_write(codegen.GENERATED_PATH, codegen.generate_source().encode())
        print(f"derived {len(codegen.all_derivations())} losses (loss, gradient, HVP) and the lemma constants; "
              f"wrote {path} in {time.perf_counter() - t0:.1f} s")
    if args.prove:
        from derivations.proofs import prove, sizes_up_to

        failed = 0
        for dd, nn in sizes_up_to(args.prove):
            for variant, heads in (("attention", 2), ("output", 1)):
                r = prove(variant, dd, nn, heads=heads, bias=True)
                print(r.line(), flush=True)
                failed += not r.proved
        if failed:
            print(f"{failed} proofs FAILED", file=sys.stderr)
            return 1
    return 0
