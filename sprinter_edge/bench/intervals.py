"""Confidence intervals for pass rates: how many points a HumanEval run can resolve."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959964


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a pass rate (sound at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = passed / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def paired_difference(method: Sequence[bool], reference: Sequence[bool], *, n_boot: int = 4000,
                      seed: int = 0) -> tuple[float, float, float]:
    """Pass rate of `method` minus `reference` on the same problems, with a 95% bootstrap
    interval over problems: pairing removes the problems both solve or both fail, so the
    interval is far narrower than the difference of two independent intervals."""
    a = np.asarray(method, float)
    b = np.asarray(reference, float)
    if a.shape != b.shape:
        raise ValueError("the two runs cover different problems")
    d = a - b
    if len(d) == 0:
        return (0.0, 0.0, 0.0)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return (float(d.mean()), float(lo), float(hi))
