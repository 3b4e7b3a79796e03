"""Probability math shared by decoding, verifiers and training (imports nothing of ours)."""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - float(np.max(logits))
    e = np.exp(z)
    return e / e.sum()


def confidence(logits: np.ndarray) -> tuple[float, float]:
    """The draft's own confidence at temperature 1: max probability and entropy (nats).

    float32 exponentials with float64 sums: ~10x cheaper than float64 over a 152k vocabulary,
    and accurate to ~1e-6. No np.dot: a BLAS call wakes OpenBLAS threads that spin and steal
    the cores llama.cpp needs."""
    x = np.asarray(logits, dtype=np.float32)
    z = x - x.max()
    e = np.exp(z)
    s = float(e.sum(dtype=np.float64))
    e *= z
    entropy = float(np.log(s) - e.sum(dtype=np.float64) / s)
    return 1.0 / s, entropy


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """TV(p, q) = 1/2 sum |p - q| of two probability vectors."""
    return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())
