"""Helpers the benchmark scripts share (run as ``python benchmarks/X.py``, so this directory is on the path)."""

from __future__ import annotations

import argparse
import time


def timed(f):
    """``(f(), seconds)``, wall time by ``time.perf_counter``."""
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def size_pairs(text: str) -> list[tuple[int, int]]:
    """``--sizes`` as d x n pairs, ``"32x64,64x128"`` -> ``[(32, 64), (64, 128)]`` (argparse type)."""
    try:
        pairs = [tuple(int(v) for v in s.split("x")) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes d x n pairs like 32x64,64x128, got {text!r}") from None
    if any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"--sizes takes d x n pairs of positive integers, got {text!r}")
    return pairs
