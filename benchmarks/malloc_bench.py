"""glibc malloc as it comes against `solver.memory.keep_freed_memory`, on the same recover + recheck run.

    python benchmarks/malloc_bench.py [--d 32] [--n 64] [--seed 0] [--repeats 2] [--json PATH]

Each run is a fresh ``benchmarks/recover_bench.py accuracy --families one`` process on one planted
one-head instance (recover, certificate, recheck), with ``UNMASK_KEEP_FREED_MEMORY`` set to ``0``
(malloc as it comes) or ``1``; the two settings alternate, ``--repeats`` times each, so both see the
same machine load. Per run: wall time, user and system CPU time and peak resident memory of that
process alone (``os.wait4``), its page faults, and what it recovered (the distance to the planted
orbit may move by rounding, the status and exactness must agree: the settings only change where memory
comes from).
Prints a table with the ratios keep / system of the medians and writes JSON (default
``benchmarks/results/malloc_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver.io import atomic_write_json  # noqa: E402

SETTINGS = {"system": "0", "keep": "1"}


def one_run(setting: str, d: int, n: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, "UNMASK_KEEP_FREED_MEMORY": SETTINGS[setting],
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, str(ROOT / "benchmarks" / "recover_bench.py"), "accuracy", "--families", "one",
               "--sizes", str(d), "--mults", str(n // d), "--seeds", str(seed), "--json", str(out)]
        log = Path(tmp) / "stderr.txt"
        with open(log, "wb") as err:  # a file, not a pipe: a pipe filled by the child before wait4 would block it
            t = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
        if proc.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"malloc_bench: {' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
        row = json.loads(out.read_text())["rows"][0]
    seed_row = row["per_seed"][0]
    return {"setting": setting, "wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "peak_rss_kib": usage.ru_maxrss, "minor_faults": usage.ru_minflt, "status": seed_row["status"],
            "rechecked": seed_row.get("rechecked", False), "error": seed_row["error"],
            "recover_s": seed_row["seconds"], "recheck_s": seed_row.get("recheck_seconds")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--n", type=int, default=64, help="a multiple of --d")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting (alternating)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "malloc_bench.json"))
    args = ap.parse_args(argv)
    if args.d < 1 or args.n < args.d or args.n % args.d or args.repeats < 1:
        ap.error("need d >= 1, n a positive multiple of d and repeats >= 1")
    runs = []
    for i in range(args.repeats):
        for setting in SETTINGS:
            runs.append(one_run(setting, args.d, args.n, args.seed))
            r = runs[-1]
            print(f"  run {i + 1}, {setting:6s}: wall {r['wall_s']:7.1f} s  user {r['user_s']:7.1f} s  sys {r['sys_s']:7.1f} s  "
                  f"peak {r['peak_rss_kib'] / 2**20:5.2f} GiB  {r['status']}, error {r['error']:.1e}", file=sys.stderr, flush=True)
    # the settings change where memory comes from, which can move rounding (alignment): compare outcomes
    outcome = {(r["status"], r["rechecked"], r["error"] <= 1e-8) for r in runs}
    med = {s: {k: statistics.median(r[k] for r in runs if r["setting"] == s)
               for k in ("wall_s", "user_s", "sys_s", "peak_rss_kib", "minor_faults")} for s in SETTINGS}
    ratios = {k: med["keep"][k] / med["system"][k] if med["system"][k] else None for k in med["keep"]}
    print(f"one head (d, n) = ({args.d}, {args.n}), seed {args.seed}, {args.repeats} run(s) per setting, medians")
    print(f"{'setting':8s} {'wall s':>9s} {'user s':>9s} {'sys s':>9s} {'peak GiB':>9s} {'faults':>10s}")
    for s in SETTINGS:
        m = med[s]
        print(f"{s:8s} {m['wall_s']:9.1f} {m['user_s']:9.1f} {m['sys_s']:9.1f} {m['peak_rss_kib'] / 2**20:9.2f} {m['minor_faults']:10.0f}")
    print("keep / system: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items() if v is not None))
    print(f"outcomes (status, rechecked, exact) across runs: {sorted(outcome)}; errors "
          f"{min(r['error'] for r in runs):.2e} to {max(r['error'] for r in runs):.2e}")
    atomic_write_json(args.json, {"command": " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
                                  "d": args.d, "n": args.n, "seed": args.seed, "runs": runs, "medians": med,
                                  "ratios_keep_over_system": ratios, "same_outcome": len(outcome) == 1})
    return 0


if __name__ == "__main__":
    sys.exit(main())
