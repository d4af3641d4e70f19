"""Memory estimates made before anything is allocated, and the budget check.

The generated kernels hold a few (n, n) temporaries per head: the logits, the
softmax, the residual and (for the HVP) their directional derivatives. XLA's
own accounting (``jax.jit(f).lower(...).compile().memory_analysis()``) gives,
for the attention kernels in float64, temporaries of about 3.5 H n^2 (gradient)
and 10.5 H n^2 (HVP) values at d = 8 ... 256, n = 16 ... 512. The estimates
below use rounder, larger coefficients so they are upper bounds; the test
``tests/test_scale.py`` compares them with XLA's accounting.

Estimates are in bytes for one instance; a batch multiplies by the instances
one device holds (:func:`instances_per_device`).
"""

from __future__ import annotations

import ctypes
import math
import os
import sys

import numpy as np

from .errors import MemoryBudgetError

GIB = 1024**3
# (n, n) temporaries per head, and (d, n) temporaries, of each operation
_NN = {"loss": 3, "grad": 6, "hvp": 12}
_DN = {"loss": 2, "grad": 4, "hvp": 8}
# matrix-free certified solve: Newton/CG vectors, Lanczos basis (eigsh ncv = 20) and
# the solver's own copies, in (d, n) vectors
_SOLVE_VECTORS = 48
OPERATIONS = ("loss", "grad", "hvp", "solve", "newton")


def data_bytes(d: int, n: int, heads: int, itemsize: int, d_v: int = 0) -> int:
    """The instance itself: W, u, B (n x n or n x d_v), W_V, Gamma, X0 and X."""
    b_cols = d_v if d_v else n
    values = heads * (d * d + d + n * b_cols + d * d_v) + 3 * d * n
    return values * itemsize


def operation_bytes(op: str, d: int, n: int, heads: int = 1, dtype=np.float64, d_v: int = 0,
                    dense_max: int | None = None) -> int:
    """Peak bytes of one evaluation of ``op`` on one instance (data included).

    **Arguments**

    - `op`: ``"loss"``, ``"grad"``, ``"hvp"``, ``"newton"`` (one batched Newton/LM
      iteration: HVP plus the CG vectors) or ``"solve"`` (the certified solve of
      :func:`solver.recover.recover`)
    - `d`, `n`, `heads`, `dtype`, `d_v` (output variant): the instance's sizes
    - `dense_max`: the dn up to which the solve forms the dense Hessian
      (default :data:`solver.newton.DENSE_MAX`)
    """
    if op not in OPERATIONS:
        raise ValueError(f"operation {op!r}; expected one of {OPERATIONS}")
    itemsize = np.dtype(dtype).itemsize
    base = data_bytes(d, n, heads, itemsize, d_v)
    cols = max(n, d_v)
    kernel = "hvp" if op in ("solve", "newton") else op
    temps = (_NN[kernel] * heads * n * cols + _DN[kernel] * heads * d * n + heads * d * d) * itemsize
    if op == "newton":
        temps += 12 * d * n * itemsize
    if op == "solve":
        if dense_max is None:
            from .newton import DENSE_MAX as dense_max
        dn = d * n
        if dn <= dense_max:
            # dense Hessian, its Cholesky factor and a projected copy, float64
            temps += 3 * dn * dn * 8
        temps += _SOLVE_VECTORS * dn * 8
    return int(base + temps)


def available_bytes() -> int:
    """Physical memory this process could use: the system's free memory (``os.sysconf``; 8 GiB when
    unknown) plus the free memory its own malloc holds for reuse (`reusable_heap_bytes`). Without the
    second term a process that keeps freed memory (`keep_freed_memory`) counts its own free heap as
    used: one head (64, 256), seed 1, certified and then refused its own recheck (about 6.8 GiB
    needed) with about 9 GB of its own freed blocks held beside a test run."""
    try:
        free = int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 * GIB
    return free + reusable_heap_bytes()


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def reusable_heap_bytes() -> int:
    """Bytes of free chunks glibc's malloc holds in this process (``mallinfo2().fordblks``, every arena),
    which the next allocations reuse and the system counts as used; 0 off glibc or before glibc 2.33
    (no ``mallinfo2``). Free chunks can be fragmented, so this is what may be reused, not one block."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return 0
    mallinfo2.argtypes, mallinfo2.restype = [], _Mallinfo2
    return int(mallinfo2().fordblks)


def device_bytes(device=None) -> int | None:
    """The allocator limit of an accelerator (``memory_stats()['bytes_limit']``), None on CPU."""
    import jax

    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # CPU devices do not implement it in every jaxlib
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def host_budget() -> int:
    """Bytes host (NumPy) work may use: the smaller of 8 GiB and 3/4 of the available host memory."""
    return int(min(8 * GIB, 0.75 * available_bytes()))


def default_budget(device=None) -> int:
    """Bytes one device may use: its allocator limit on an accelerator, else `host_budget`."""
    limit = device_bytes(device)
    if limit is not None:
        return int(0.9 * limit)
    return host_budget()


def instances_per_device(batch: int, devices: int) -> int:
    """Instances one device holds once the batch is padded to a multiple of ``devices``."""
    return math.ceil(batch / max(1, devices))


def require_within_budget(op: str, d: int, n: int, heads: int = 1, *, dtype=np.float64, d_v: int = 0,
                          batch: int = 1, devices: int = 1, budget: int | None = None) -> int:
    """Estimated bytes per device of ``op`` on ``batch`` instances over ``devices``.

    Raises :class:`~solver.errors.MemoryBudgetError` naming the sizes and the
    estimate when it exceeds ``budget`` (default :func:`default_budget`).
    """
    per = instances_per_device(batch, devices)
    need = per * operation_bytes(op, d, n, heads, dtype, d_v)
    budget = default_budget() if budget is None else int(budget)
    if need > budget:
        raise MemoryBudgetError(
            f"{op} on {batch} instance(s) of d = {d}, n = {n}, {heads} head(s), {np.dtype(dtype).name} over "
            f"{devices} device(s) needs about {need / GIB:.2f} GiB per device ({per} instance(s) each, "
            f"{operation_bytes(op, d, n, heads, dtype, d_v) / GIB:.3f} GiB per instance), over the budget of "
            f"{budget / GIB:.2f} GiB; use fewer instances per call, more devices, or float32")
    return need


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
KEEP_FREED_MEMORY_ENV = "UNMASK_KEEP_FREED_MEMORY"  # "0": `keep_freed_memory` does nothing


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep the memory NumPy frees for reuse, instead of handing it back to the
    system; returns whether it did (False off glibc, or where the environment variable
    ``UNMASK_KEEP_FREED_MEMORY`` is ``0``).

    glibc serves every allocation above 32 MiB with its own ``mmap`` and unmaps it on ``free``, so each
    large NumPy temporary arrives as fresh pages: a page fault each, and the kernel zeroes every page again. The
    certificates of large instances make many such temporaries (`proofs_check.rigorous`'s streamed
    ``J P``: row blocks of 1 GiB, and the ball arithmetic's intermediates). This asks for no ``mmap``
    (``M_MMAP_MAX = 0``: large blocks come from the heap), no trimming of the heap's top
    (``M_TRIM_THRESHOLD = -1``) and 1 GiB of slack whenever the heap grows (``M_TOP_PAD``, address space
    only until touched), so a freed block is reused by the next one of its size.

    The process's resident memory then stays at its peak instead of falling between peaks; the peak itself
    can grow where freed blocks do not fit later requests (fragmentation). ``unmask``'s command line and
    ``benchmarks/recover_bench.py`` call it at start-up; the test suite and the library (on import) do not,
    since it is process-wide and cannot be undone: a library user calls it (or not) once, before the large work.
    ``benchmarks/malloc_bench.py`` measures both settings side by side.
    """
    if os.environ.get(KEEP_FREED_MEMORY_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not (hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")):  # glibc only (musl ignores these)
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = [mallopt(param, value) == 1 for param, value in
            ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1), (_M_TOP_PAD, 1 << 30))]
    return all(done)


__all__ = ["GIB", "OPERATIONS", "data_bytes", "operation_bytes", "available_bytes", "device_bytes",
           "default_budget", "instances_per_device", "keep_freed_memory", "require_within_budget",
           "reusable_heap_bytes"]
