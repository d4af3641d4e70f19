"""Scale: batches over devices, the memory estimate, the matrix-free Newton path.

The sharded runs need several devices, which JAX fixes at start-up, so they run
in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver import planted_instance
from solver.batch import ProblemBatch, batch_grad, batch_hvp, batch_loss
from solver.errors import InvalidProblemError, MemoryBudgetError
from solver.memory import operation_bytes, require_within_budget

ROOT = Path(__file__).resolve().parents[1]
EPS = float(np.finfo(np.float64).eps)


def _subprocess(args, devices: int, timeout: int = 240):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


# every batched operation on 1, 2 and 4 devices; N = 6 is padded to 8 on 4 devices
_SHARDED = r"""
import json, sys
import jax
import numpy as np
import solver
from solver import planted_instance
from solver.batch import (ProblemBatch, batch_grad, batch_gradient_check, batch_hvp, batch_loss,
                          batch_newton)

jax.config.update("jax_numpy_dtype_promotion", "strict")
N, d, n = 6, 4, 7
pairs = [planted_instance(d, n, heads=2, seed=s, bias=s % 2 == 1) for s in range(N)]
batch = ProblemBatch.from_problems([p for p, _ in pairs])
rng = np.random.default_rng(1)
X = np.stack([x for _, x in pairs]) + 0.3 * rng.normal(size=(N, d, n))
V = rng.normal(size=(N, d, n))
out = {"devices": len(jax.devices())}
for k in (1, 2, len(jax.devices())):
    devs = jax.devices()[:k]
    out[k] = {"loss": batch_loss(batch, X, devices=devs).tolist(), "grad": batch_grad(batch, X, devices=devs).tolist(),
              "hvp": batch_hvp(batch, X, V, devices=devs).tolist()}
    if k != 2:  # the iterative ones (slower to compile) on 1 and 4 devices
        Xn, fn, gn = batch_newton(batch, X, iterations=6, cg_iterations=8, devices=devs)
        ge, he = batch_gradient_check(batch, X, V, devices=devs)
        out[k].update(newton_X=Xn.tolist(), newton_loss=fn.tolist(), grad_error=ge.tolist(), hvp_error=he.tolist())
out["single"] = {"loss": [float(p.loss(x)) for (p, _), x in zip(pairs, X)],
                 "grad": [np.asarray(p.grad(x)).tolist() for (p, _), x in zip(pairs, X)],
                 "hvp": [np.asarray(p.hvp(x, v)).tolist() for (p, _), x, v in zip(pairs, X, V)],
                 "loss0": [float(p.loss(x)) for (p, _), x in zip(pairs, X)]}
print(json.dumps(out))
"""


def _close(a, b, scale_factor: float = 64.0):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    tol = scale_factor * EPS * (1.0 + np.max(np.abs(b)))
    np.testing.assert_allclose(a, b, rtol=0, atol=tol)


def test_sharded_batch_matches_single_device(tmp_path):
    script = tmp_path / "sharded.py"
    script.write_text(_SHARDED)
    proc = _subprocess([str(script)], devices=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    one, single = out["1"], out["single"]
    for k in ("2", "4"):
        for key in ("loss", "grad", "hvp"):
            _close(out[k][key], one[key])
        assert len(out[k]["loss"]) == 6  # the padding (6 -> 8 on 4 devices) is dropped
    _close(out["4"]["newton_loss"], one["newton_loss"])
    # a fixed number of LM iterations: rounding can flip an accept, so compare the iterates loosely
    _close(out["4"]["newton_X"], one["newton_X"], scale_factor=1e6)
    for key in ("grad_error", "hvp_error"):
        assert len(out["4"][key]) == 6
    for key in ("loss", "grad", "hvp"):
        _close(one[key], single[key])
    # LM accepts only decreasing steps, and it makes progress; the kernels pass the difference check
    assert all(f <= f0 for f, f0 in zip(one["newton_loss"], single["loss0"]))
    assert sum(one["newton_loss"]) < 0.5 * sum(single["loss0"])
    assert max(one["grad_error"]) < 100 * EPS ** (2 / 3)
    assert max(one["hvp_error"]) < 100 * EPS ** (2 / 3)


def test_mixed_shapes_are_refused():
    p1, _ = planted_instance(3, 5, heads=2, seed=0)
    p2, _ = planted_instance(3, 6, heads=2, seed=1)
    p3, _ = planted_instance(3, 5, heads=1, seed=2)
    for other in (p2, p3):
        with pytest.raises(InvalidProblemError, match="one shape"):
            ProblemBatch.from_problems([p1, other])
    with pytest.raises(InvalidProblemError, match="at least one"):
        ProblemBatch.from_problems([])
    batch = ProblemBatch.from_problems([p1, p1])
    with pytest.raises(InvalidProblemError, match="expected shape"):
        batch_grad(batch, np.zeros((3, 3, 5)))


def test_batch_matches_problem_and_roundtrips():
    pairs = [planted_instance(3, 5, heads=2, seed=s, bias=True) for s in range(3)]
    batch = ProblemBatch.from_problems([p for p, _ in pairs])
    X = np.stack([x for _, x in pairs])
    g = batch_grad(batch, X)
    f = batch_loss(batch, X)
    for i, (p, x) in enumerate(pairs):
        _close(g[i], np.asarray(p.grad(x)))
        _close(f[i], float(p.loss(x)))
        assert batch.problem(i).fingerprint() == p.fingerprint()


def test_memory_refusal_names_the_size():
    # a layer-sized batch (d = 4096, n = 4096, 32 heads) is refused before any array exists
    with pytest.raises(MemoryBudgetError, match=r"d = 4096, n = 4096, 32 head"):
        require_within_budget("hvp", 4096, 4096, 32, batch=64, devices=4, budget=8 * 1024**3)
    pairs = [planted_instance(3, 5, heads=2, seed=s) for s in range(2)]
    batch = ProblemBatch.from_problems([p for p, _ in pairs])
    X = np.stack([x for _, x in pairs])
    need = require_within_budget("hvp", 3, 5, 2, batch=2, devices=1, budget=10**9)
    with pytest.raises(MemoryBudgetError, match="GiB per device"):
        batch_hvp(batch, X, X, devices=jax.devices()[:1], budget=need - 1)
    # more devices hold fewer instances each
    assert require_within_budget("hvp", 64, 64, 2, batch=8, devices=4, budget=10**12) < \
        require_within_budget("hvp", 64, 64, 2, batch=8, devices=1, budget=10**12)


_REFAULT = """
import resource, sys
import numpy as np
from solver.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
a = np.ones(1 << 26); del a  # 512 MiB, touched and freed
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(1 << 26)         # the same size again: fresh pages, or the freed ones
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_keep_freed_memory_reuses_a_freed_block_without_page_faults():
    # each in a fresh process: the allocator's settings are per process and cannot be undone
    def run(arg, **env):
        out = subprocess.run([sys.executable, "-c", _REFAULT, arg], capture_output=True, text=True, check=True,
                             env={**os.environ, **env}).stdout.split()
        return out[0], int(out[1])

    kept, faults_kept = run("keep")
    _, faults_system = run("system")
    off, faults_off = run("keep", UNMASK_KEEP_FREED_MEMORY="0")
    assert kept == "True" and off == "False"
    # 512 MiB of fresh pages fault at least once per 2 MiB huge page (256), at most once per 4 KiB page
    assert faults_system >= 256 and faults_off >= 256
    assert faults_kept < 16


_HELD = """
import sys
import numpy as np
from solver.memory import available_bytes, keep_freed_memory, reusable_heap_bytes
if sys.argv[1] == "keep":
    keep_freed_memory()
h0 = reusable_heap_bytes()
a = np.ones(1 << 26); del a  # 512 MiB, touched and freed
print(h0, reusable_heap_bytes(), available_bytes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's mallinfo2")
def test_the_budget_counts_the_free_heap_a_process_keeps_as_available():
    """With freed memory kept, 512 MiB freed stays in the process (the system counts it as used) and
    reusable_heap_bytes reports it, so host_budget does not shrink by the process's own free heap;
    with malloc as it comes the block went back to the system and is not counted twice."""
    def run(arg):
        out = subprocess.run([sys.executable, "-c", _HELD, arg], capture_output=True, text=True, check=True).stdout
        return [int(v) for v in out.split()]

    h0, h1, avail = run("keep")
    assert h1 - h0 >= (1 << 29) * 0.99 and avail >= h1
    h0, h1, _ = run("system")
    assert h1 - h0 < 1 << 24  # the mmapped block was unmapped


@pytest.mark.parametrize("d,n,heads", [(4, 9, 1), (16, 40, 2), (48, 96, 3)])
def test_memory_estimate_bounds_xla_accounting(d, n, heads):
    from solver import _generated as gen

    S = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float64)  # noqa: E731
    data = (S(heads, d, d), S(heads, d), S(heads, n, n), S(d, n), S(d, n))
    for op, fn, args in (("grad", gen.attention_grad, (S(d, n),) + data),
                         ("hvp", gen.attention_hvp, (S(d, n), S(d, n)) + data)):
        m = jax.jit(fn).lower(*args).compile().memory_analysis()
        xla = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
        est = operation_bytes(op, d, n, heads)
        assert xla <= est, (op, xla, est)
        assert est <= 8 * xla, (op, xla, est)  # and not uselessly loose


def test_distributed_example_runs_single_process():
    proc = _subprocess([str(ROOT / "examples" / "distributed.py"), "--instances", "5", "--d", "3", "--n", "6"],
                       devices=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "distributed OK" in proc.stdout, proc.stdout


@pytest.mark.parametrize("d,n", [(6, 30), (10, 24)])
def test_matrix_free_eigenvalues_and_newton_match_dense(monkeypatch, d, n):
    import solver.newton
    from solver.newton import extreme_eigenvalues, newton_direction

    monkeypatch.setattr(solver.newton, "DENSE_MAX", 0)  # the matrix-free branches at a size where eigh is cheap
    problem, X_true = planted_instance(d, n, heads=2, seed=3)
    X = X_true + 1e-3 * np.random.default_rng(0).normal(size=X_true.shape)
    H = np.asarray(problem.hessian(X))
    ev = np.linalg.eigvalsh((H + H.T) / 2)
    lo, hi, margin = extreme_eigenvalues(problem, X)
    # the enclosure holds, and the margin is small against lambda_min (else it certifies nothing)
    assert lo - margin <= ev[0] <= lo + 1e3 * EPS * ev[-1]
    assert hi - margin <= ev[-1] <= hi + margin
    assert margin < 0.05 * ev[0]
    # early stop: the returned value is still an upper bound of lambda_min, below the requested floor
    floor = 10 * ev[0]
    early, _, _ = extreme_eigenvalues(problem, X, stop_below=floor)
    assert ev[0] * (1 - 1e-9) <= early < floor
    g = np.asarray(problem.grad(X))
    s, _ = newton_direction(problem, X, g, forcing=1e-10)
    assert np.linalg.norm(H @ s.reshape(-1) + g.reshape(-1)) <= 1e-8 * np.linalg.norm(g)


def _rotations_invariant(O, ab):
    """W = O^T blockdiag(a_k I + b_k J) O: every rotation in the k-th 2-plane (conjugated by O) fixes it."""
    d = O.shape[0]
    M = np.zeros((d, d))
    for k, (a, b) in enumerate(ab):
        M[2 * k:2 * k + 2, 2 * k:2 * k + 2] = [[a, b], [-b, a]]
    return O.T @ M @ O


def test_commutant_stabiliser_matches_dense():
    import scipy.linalg

    from solver import Problem
    from solver.symmetry import _symmetries_large, symmetries

    rng = np.random.default_rng(3)
    d = 8
    O = scipy.linalg.qr(rng.normal(size=(d, d)))[0]
    B = np.full((2, 5, 5), 0.2)
    for W in (np.stack([_rotations_invariant(O, rng.normal(size=(4, 2))) for _ in range(2)]),
              rng.normal(size=(2, d, d))):
        p = Problem.create(W, B)
        dense, large = symmetries(p), _symmetries_large(p, np.asarray(p.W), 1e-10)
        assert dense.dimension == large.dimension
        k = dense.lie_algebra.shape[0]
        if k:
            A = dense.lie_algebra.reshape(k, -1).T
            Bl = large.lie_algebra.reshape(k, -1).T
            np.testing.assert_allclose(np.linalg.svd(A.T @ Bl)[1], np.ones(k), atol=1e-8)  # one subspace
    # a common stabiliser with repeated eigenvalues of W_1^{-1} W_2: refused, with the size
    Wa = rng.normal(size=(d, d))
    W = np.stack([Wa.T @ Wa, Wa.T @ np.diag(np.r_[np.ones(4), 2 * np.ones(4)]) @ Wa])
    with pytest.raises(MemoryBudgetError, match="d = 8"):
        _symmetries_large(Problem.create(W, B), W, 1e-10)


def test_symmetries_take_the_commutant_above_d32_and_fall_back_to_the_dense_system(monkeypatch):
    """Above LIE_COMMUTANT_MIN_D two heads go through the commutant (0.1 s at d = 64, where the dense
    system took 80 s); same algebra as the dense system, and where the reduction does not apply
    (repeated eigenvalues of W_1^{-1} W_2) the dense system is used, not refused."""
    import scipy.linalg

    import solver.symmetry as symmetry_module
    from solver import Problem
    from solver.symmetry import symmetries

    rng = np.random.default_rng(4)
    d = 34
    O = scipy.linalg.qr(rng.normal(size=(d, d)))[0]
    B = np.full((2, 5, 5), 0.2)
    Wa = rng.normal(size=(d, d))
    repeated = np.stack([Wa.T @ Wa, Wa.T @ np.diag(np.r_[np.ones(d // 2), 2 * np.ones(d // 2)]) @ Wa])
    for W in (np.stack([_rotations_invariant(O, rng.normal(size=(d // 2, 2))) for _ in range(2)]),
              rng.normal(size=(2, d, d)), repeated):
        p = Problem.create(W, B)
        calls = []
        real_large = symmetry_module._symmetries_large
        monkeypatch.setattr(symmetry_module, "_symmetries_large", lambda *a: calls.append(1) or real_large(*a))
        fast = symmetries(p)
        monkeypatch.setattr(symmetry_module, "LIE_COMMUTANT_MIN_D", d)
        dense = symmetries(p)
        monkeypatch.undo()
        assert calls == [1]  # the commutant was tried (and, for `repeated`, refused)
        assert fast.dimension == dense.dimension and fast.sign_flip == dense.sign_flip
        k = dense.lie_algebra.shape[0]
        if k:
            A, Bl = dense.lie_algebra.reshape(k, -1).T, fast.lie_algebra.reshape(k, -1).T
            np.testing.assert_allclose(np.linalg.svd(A.T @ Bl)[1], np.ones(k), atol=1e-8)
    assert symmetries(Problem.create(repeated, B)).dimension >= 1  # the stabiliser of the repeated pair


def test_lanczos_converges_where_300_steps_did_not_and_keeps_to_its_memory_cap(monkeypatch):
    """A spectrum like that of two heads (64, 128), seed 7 (lambda_min 3.7e-5 against lambda_max
    0.7, refused with 300 steps): one eigenvalue 3e-5 below a dense band from 6e-5 to 1. The
    default converges it (380 steps here); the Krylov basis stays within LANCZOS_MAX_BYTES."""
    import solver.newton as newton

    dim = 4000
    ev = np.r_[3e-5, np.linspace(6e-5, 1.0, dim - 1)]
    v0 = np.random.default_rng(0).normal(size=dim)
    theta, residual, steps = newton.lanczos_smallest(lambda v: ev * v, v0)
    assert steps > 300
    assert residual <= 1e-2 * theta and abs(theta - 3e-5) <= residual
    monkeypatch.setattr(newton, "LANCZOS_MAX_BYTES", 8 * dim * 50)
    assert newton.lanczos_smallest(lambda v: ev * v, v0)[2] == 50


@pytest.mark.parametrize("d", [34, 35])
@pytest.mark.parametrize("bias", [False, True])
def test_one_head_takes_the_commutant_of_its_symmetric_and_antisymmetric_parts(monkeypatch, d, bias):
    """One head above LIE_COMMUTANT_MIN_D: the algebra from the commutant of ``(W + W^T)^{-1} (W -
    W^T)`` is the dense system's (the same subspace, the same translations, sign flip and affine
    bias), odd d included (a zero eigenvalue); a symmetric W (W - W^T = 0: one repeated eigenvalue)
    falls back to the dense system. At one head (64, 128) the dense SVD took 63 s of recover."""
    import solver.symmetry as symmetry_module
    from solver import Problem
    from solver.symmetry import symmetries

    rng = np.random.default_rng(d)
    B = np.full((5, 5), 0.2)
    u = rng.normal(size=d) if bias else None
    Wg = rng.normal(size=(d, d))
    for W, reduced in ((Wg, True), (Wg + Wg.T, False)):
        p = Problem.create(W, B, u=u)
        calls = []
        real_large = symmetry_module._symmetries_large

        def spy(*a):
            try:
                out = real_large(*a)
            except Exception:
                calls.append("refused")
                raise
            calls.append("reduced")
            return out

        monkeypatch.setattr(symmetry_module, "_symmetries_large", spy)
        fast = symmetries(p)
        monkeypatch.setattr(symmetry_module, "LIE_COMMUTANT_MIN_D", d)
        dense = symmetries(p)
        monkeypatch.undo()
        assert calls == ["reduced" if reduced else "refused"]
        assert fast.dimension == dense.dimension and fast.sign_flip == dense.sign_flip
        assert (fast.affine is None) == (dense.affine is None) == (not bias)
        assert fast.translations.shape == dense.translations.shape
        k = dense.lie_algebra.shape[0]
        assert k >= d // 2  # a generic W: floor(d / 2) (more for a symmetric one)
        A, Bl = dense.lie_algebra.reshape(k, -1).T, fast.lie_algebra.reshape(k, -1).T
        np.testing.assert_allclose(np.linalg.svd(A.T @ Bl)[1], np.ones(k), atol=1e-8)
