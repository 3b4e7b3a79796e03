"""Percentile intervals from a bootstrap over prompt groups: near-duplicate prompts share a
group, so resampling groups (not rows) never counts them as independent evidence."""

from __future__ import annotations

import numpy as np


def _boot_weights(n_groups: int, n_boot: int, seed: int) -> np.ndarray:
    """Group resampling with replacement as multinomial counts (B x G)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(np.float64)


def _interval(samples: np.ndarray) -> list[float | None]:
    ok = samples[np.isfinite(samples)]
    if len(ok) < 0.5 * len(samples) or len(ok) == 0:
        return [None, None]
    return [float(np.percentile(ok, 2.5)), float(np.percentile(ok, 97.5))]


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
