"""``unmask recover``: X from W and B files, with a certificate."""

from __future__ import annotations

import sys
import time

HELP = "recover X from attention weights W (.npy) and attention maps B (.npy)"


def add_problem_arguments(p):
    """The instance's files and regulariser, shared with ``unmask recheck``."""
    p.add_argument("--W", required=True, help="(d, d) or (H, d, d) .npy")
    p.add_argument("--B", required=True, help="(n, n) or (H, n, n) .npy attention maps; with --W-V the outputs, "
                                              "(n, d_v) or (H, n, d_v)")
    p.add_argument("--W-V", dest="W_V", help="value matrices (d, d_v) or (H, d, d_v) .npy: the attention-output variant")
    p.add_argument("--u", help="key bias, (d,) or (H, d) .npy")
    p.add_argument("--reg", type=float, default=0.0, help="regulariser weight gamma (scalar, default 0)")


def load_problem(args):
    """The Problem of `add_problem_arguments`' files (typed errors for unreadable or invalid ones)."""
    from solver import Problem
    from solver.io import load_array

    return Problem.create(load_array(args.W, "--W"), load_array(args.B, "--B"),
                          u=load_array(args.u, "--u") if args.u else None, gamma=args.reg,
                          W_V=load_array(args.W_V, "--W-V") if args.W_V else None)


def add_arguments(p):
    add_problem_arguments(p)
    p.add_argument("--out", required=True, help="where to write X (.npy, written atomically)")
    p.add_argument("--certificate", help="where to write the certificate JSON")
    p.add_argument("--no-certify", action="store_true", help="return an uncertified answer instead of refusing")
    p.add_argument("--restarts", type=int, default=None,
                   help="random starts where the closed form does not apply (default: 8; 1024 for the square "
                        "output system, one head with d_v = d, where the search stops at the first proved root)")
    p.add_argument("--seed", type=int, default=0, help="seed of those random starts (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args) -> int:
    from pathlib import Path

    from solver.certificate import fit_verdict
    from solver.errors import InputFileError
    from solver.io import atomic_save_npy, atomic_write_json
    from solver.recover import recover

    for target in [args.out] + ([args.certificate] if args.certificate else []):
        if not Path(target).resolve().parent.is_dir():
            raise InputFileError(f"output directory of {target} does not exist; create it first")
    t0 = time.perf_counter()
    problem = load_problem(args)
    if not args.quiet:
        print(f"d={problem.d} n={problem.n} heads={problem.heads}, {problem.variant}", file=sys.stderr, flush=True)

    def progress(message):
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr, flush=True)

    result = recover(problem, certify=not args.no_certify, restarts=args.restarts, seed=args.seed, progress=progress)
    atomic_save_npy(args.out, result.X)
    if args.certificate:
        atomic_write_json(args.certificate, result.certificate.as_dict())
    print(f"d={problem.d} n={problem.n} heads={problem.heads}: init {result.init}, loss {result.certificate.loss:.3e}, "
          f"{len(result.history)} iterations, {time.perf_counter() - t0:.1f} s")
    print(result.certificate.summary())
    # the fit, certified or not: a certified critical point of a B that no X produces is no recovery
    print(f"fit: {fit_verdict(problem, result.certificate.loss)}")
    print(f"wrote {args.out}" + (f" and {args.certificate}" if args.certificate else ""))
    return 0
