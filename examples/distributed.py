"""Multi-host batched recovery with ``jax.distributed``: a runnable example.

One process per host; every process builds the same batch (planted instances
from seeds, so no data has to be shipped), ``solver.batch`` shards it over the
devices of all processes, each device runs its slice, and the results are
gathered on every process.

Locally (one process, here with 4 simulated CPU devices)::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
        python examples/distributed.py --instances 8

On two hosts (run the same command on each, with its own --process-id; the
coordinator is host 0's address and a free port)::

    host0$ python examples/distributed.py --coordinator host0:12355 --num-processes 2 --process-id 0
    host1$ python examples/distributed.py --coordinator host0:12355 --num-processes 2 --process-id 1

On a cluster scheduler that JAX recognises (SLURM, Open MPI, Cloud TPU),
``jax.distributed.initialize()`` finds these values itself: pass ``--auto``.

It prints ``distributed OK`` when the sharded gradients and the batched
Levenberg-Marquardt iterations agree with the per-instance computation.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coordinator", default=None, help="host:port of process 0 (default: localhost, a free port)")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--auto", action="store_true", help="let jax.distributed.initialize() read the cluster's settings")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--d", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    args = ap.parse_args(argv)

    if args.auto:
        jax.distributed.initialize()
    else:
        coordinator = args.coordinator or f"127.0.0.1:{_free_port()}"
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    try:
        import solver  # noqa: F401  (turns on float64)
        from solver import planted_instance
        from solver.batch import ProblemBatch, batch_grad, batch_newton

        pairs = [planted_instance(args.d, args.n, heads=2, seed=s) for s in range(args.instances)]
        batch = ProblemBatch.from_problems([p for p, _ in pairs])
        rng = np.random.default_rng(0)
        X = np.stack([x for _, x in pairs]) + 0.05 * rng.normal(size=(args.instances, args.d, args.n))
        t0 = time.perf_counter()
        g = batch_grad(batch, X)
        Xn, f, gn = batch_newton(batch, X, iterations=5, cg_iterations=20)
        seconds = time.perf_counter() - t0
        ref = np.stack([np.asarray(p.grad(x)) for (p, _), x in zip(pairs, X)])
        err = float(np.max(np.abs(g - ref)) / (1 + np.max(np.abs(ref))))
        start = np.array([float(p.loss(x)) for (p, _), x in zip(pairs, X)])
        ok = err < 64 * np.finfo(np.float64).eps and bool(np.all(f <= start))
        print(f"process {jax.process_index()} of {jax.process_count()}: {len(jax.devices())} device(s) in all, "
              f"{len(jax.local_devices())} local; {args.instances} instances of d = {args.d}, n = {args.n}")
        print(f"gradient vs per-instance: max relative difference {err:.1e}; LM loss {start.max():.2e} -> "
              f"{f.max():.2e} (worst instance), grad norm {gn.max():.2e}; {seconds:.2f} s")
        print("distributed OK" if ok else "distributed MISMATCH")
        return 0 if ok else 1
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
