"""Generated gradient / HVP against jax.grad / jax.jvp(jax.grad) of the plain transcription.

    python benchmarks/derivatives_bench.py [--sizes 64x128,256x512] [--json benchmarks/results/derivatives.json]

Prints a table and writes JSON. Times are medians of repeated jitted calls in
one process, so the ratios compare like with like on the same (noisy) machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from proofs_check import reference as ref  # noqa: E402
from solver import _generated as gen  # noqa: E402
from solver.io import atomic_write_json  # noqa: E402


def _time(fn, *args, repeat=7):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64x128,256x512")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--json", default="benchmarks/results/derivatives.json")
    args = ap.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        d, n = (int(s) for s in size.split("x"))
        for dtype in (jnp.float64, jnp.float32):
            rng = np.random.default_rng(0)
            X = jnp.asarray(rng.normal(size=(d, n)) / d**0.25, dtype)
            V = jnp.asarray(rng.normal(size=(d, n)), dtype)
            W = jnp.asarray(rng.normal(size=(args.heads, d, d)) / np.sqrt(d), dtype)
            U = jnp.asarray(rng.normal(size=(args.heads, d)) / np.sqrt(d), dtype)
            B = jnp.asarray(rng.dirichlet(np.ones(n), size=(args.heads, n)), dtype)
            G, X0 = jnp.ones((d, n), dtype), jnp.zeros((d, n), dtype)
            a = (W, U, B, G, X0)
            g_gen = jax.jit(gen.attention_grad)
            g_ad = jax.jit(jax.grad(ref.attention_loss))
            h_gen = jax.jit(gen.attention_hvp)
            h_ad = jax.jit(lambda X, V, *a: ref.hvp(ref.attention_loss, X, V, *a))
            t = {"grad_generated": _time(g_gen, X, *a), "grad_autodiff": _time(g_ad, X, *a),
                 "hvp_generated": _time(h_gen, X, V, *a), "hvp_autodiff": _time(h_ad, X, V, *a)}
            row = {"d": d, "n": n, "heads": args.heads, "dtype": jnp.dtype(dtype).name, **t,
                   "grad_ratio": t["grad_generated"] / t["grad_autodiff"],
                   "hvp_ratio": t["hvp_generated"] / t["hvp_autodiff"],
                   "hvp_over_grad": t["hvp_generated"] / t["grad_generated"]}
            rows.append(row)
    print(f"{'d':>4} {'n':>5} {'dtype':>8} {'grad gen ms':>12} {'grad AD ms':>11} {'ratio':>6} "
          f"{'hvp gen ms':>11} {'hvp AD ms':>10} {'ratio':>6} {'hvp/grad':>8}")
    for r in rows:
        print(f"{r['d']:>4} {r['n']:>5} {r['dtype']:>8} {1e3 * r['grad_generated']:12.3f} {1e3 * r['grad_autodiff']:11.3f} "
              f"{r['grad_ratio']:6.2f} {1e3 * r['hvp_generated']:11.3f} {1e3 * r['hvp_autodiff']:10.3f} {r['hvp_ratio']:6.2f} "
              f"{r['hvp_over_grad']:8.2f}")
    atomic_write_json(args.json, {"device": str(jax.devices()[0]), "rows": rows})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
