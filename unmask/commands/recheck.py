"""``unmask recheck``: a third party's check of a certificate written by ``unmask recover``.

Recomputes everything the certificate claims with :func:`proofs_check.recheck.recheck` (the
plain JAX transcription, not the solver's generated kernels; see that module) for the instance
given by the same files as ``recover`` and the X it was issued for. Exit status: 0 when the
certificate certifies X and every recomputation agrees; 1 when it is rejected (another instance,
another X, a number that does not recompute) or claims nothing (status ``uncertified``); 2 on
bad input (unreadable or invalid files, a JSON that is not a certificate).
"""

from __future__ import annotations

import json
import math
import sys
import time

from .recover import add_problem_arguments, load_problem

HELP = "re-check a certificate of `unmask recover` independently"


def add_arguments(p):
    add_problem_arguments(p)
    p.add_argument("--X", required=True, help="the (d, n) .npy the certificate was issued for (recover's --out)")
    p.add_argument("--certificate", required=True, help="the certificate JSON (recover's --certificate)")
    p.add_argument("--json", help="where to write what was recomputed (JSON, written atomically)")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def _certificate_dict(path: str) -> dict:
    from solver.errors import InputFileError
    from solver.io import load_json

    data = load_json(path, "--certificate")
    if not isinstance(data, dict):
        raise InputFileError(f"--certificate: {path} holds a JSON {type(data).__name__}, not a certificate object")
    from solver.certificate import Certificate

    missing = Certificate.missing_fields(data)
    if missing:
        raise InputFileError(f"--certificate: {path} is not a certificate of unmask recover: missing "
                             f"{', '.join(missing)}")
    if data["status"] not in ("certified", "uncertified"):
        raise InputFileError(f"--certificate: status must be 'certified' or 'uncertified', got {data['status']!r}")
    return data


def run(args) -> int:
    from pathlib import Path

    from proofs_check.recheck import recheck
    from solver.errors import CertificateMismatchError, InputFileError
    from solver.io import atomic_write_json, load_array

    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise InputFileError(f"output directory of {args.json} does not exist; create it first")
    t0 = time.perf_counter()
    problem = load_problem(args)
    X = load_array(args.X, "--X")
    problem.check_X(X, "--X")  # shape and finiteness; recheck digests X as written (check_X would cast it)
    data = _certificate_dict(args.certificate)
    if not args.quiet:
        # one line before the work: at dn = 8192 (one head) a recheck takes about 10 minutes here
        print(f"rechecking a {data.get('kind', 'local-newton')} certificate ({data['status']}) at d={problem.d} "
              f"n={problem.n} heads={problem.heads}, dn = {problem.d * problem.n}", file=sys.stderr, flush=True)
    try:
        out = recheck(data, problem, X)
    except CertificateMismatchError as exc:
        verdict, detail, rc = "rejected", str(exc), 1
    else:
        if data["status"] != "certified":
            verdict, detail, rc = "nothing to recheck", f"the certificate is uncertified: {data.get('reason', '')}", 1
        else:
            verdict, rc = "accepted", 0
            detail = (f"{data.get('kind', 'local-newton')} certificate recomputed independently: ||X - X*|| <= "
                      f"{data['error_bound']:.2e} for the instance of fingerprint {data['fingerprint'][:12]}")
    seconds = time.perf_counter() - t0
    print(f"{verdict}: {detail} ({seconds:.1f} s)")
    if rc == 0:
        for k, v in sorted(out.items()):
            if isinstance(v, float) and math.isfinite(v):
                print(f"  {k} = {v:.6g}")
    if args.json:
        record = {"verdict": verdict, "detail": detail, "seconds": seconds, "certificate": args.certificate,
                  "recomputed": out if rc == 0 else None}
        atomic_write_json(args.json, json.loads(json.dumps(record, default=str)))
    return rc
