"""Probability math shared by decoding, verifiers and training (imports nothing of ours)."""

from __future__ import annotations

import threading

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - float(np.max(logits))
    e = np.exp(z)
    return e / e.sum()


def confidence(logits: np.ndarray) -> tuple[float, float]:
    """The draft's own confidence at temperature 1: max probability and entropy (nats).

    float32 throughout (numpy's pairwise sums keep it to ~3e-7 over a 152k vocabulary), in
    reused per-thread buffers: a fresh 600 kB array per call costs more in page faults than the
    exponentials. No np.dot: a BLAS call wakes OpenBLAS threads that spin and steal the cores
    llama.cpp needs."""
    x = np.asarray(logits, dtype=np.float32)
    z, e = _buffers(x.shape[0])
    np.subtract(x, x.max(), out=z)
    max_prob, entropy, _ = _shifted_stats(z, e)
    return max_prob, entropy


_scratch = threading.local()


def _buffers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 scratch vectors of length n, this thread's own."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None or bufs[0].shape[0] != n:
        bufs = (np.empty(n, np.float32), np.empty(n, np.float32))
        _scratch.bufs = bufs
    return bufs


def _shifted_stats(z: np.ndarray, e: np.ndarray) -> tuple[float, float, float]:
    """Max probability, entropy and the partition sum s of logits `z` already shifted so that
    their maximum is 0; `e` is scratch space (left holding exp(z) * z)."""
    np.exp(z, out=e)
    s = float(e.sum())
    e *= z
    return 1.0 / s, float(np.log(s) - float(e.sum()) / s), s


def token_logprobs(logits: np.ndarray, token: int, top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """log softmax(logits)[token], and the `top` most likely tokens with theirs (most likely
    first, ties by token id): one float32 exponential pass over the row, plus a partial sort
    when top > 0."""
    x = np.asarray(logits, dtype=np.float32)
    z, e = _buffers(x.shape[0])
    np.subtract(x, x.max(), out=z)
    np.exp(z, out=e)
    lse = float(np.log(float(e.sum())))
    chosen = float(z[token]) - lse
    if top <= 0:
        return chosen, []
    top = min(top, x.shape[0])
    idx = np.argpartition(z, x.shape[0] - top)[x.shape[0] - top:]
    idx = idx[np.lexsort((idx, -z[idx]))]
    return chosen, [(int(i), float(z[i]) - lse) for i in idx]


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """TV(p, q) = 1/2 sum |p - q| of two probability vectors."""
    return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def token_features(logits: np.ndarray, token: int, temperature: float) -> tuple[float, float, float,
                                                                                float, float]:
    """What the draft's distribution says about one drafted token, cheaply (one exponential
    pass over the vocabulary at temperature 1, one more when sampling at T != 1):

    max probability, entropy (nats) and top-2 margin at temperature 1, then log q(x) and
    q(x) / max q of the drawn token x at the sampling temperature (temperature 1 under greedy
    decoding, where the drawn token is the argmax). Top-k / top-p are left out: they move
    q(x) by a renormalising constant only."""
    x = np.asarray(logits, dtype=np.float32)
    z, e = _buffers(x.shape[0])
    best = int(np.argmax(x))
    np.subtract(x, x[best], out=z)
    z[best] = -np.inf  # the runner-up, without sorting the vocabulary
    second = float(z.max()) if x.shape[0] > 1 else -np.inf
    z[best] = 0.0
    max_prob, entropy, s = _shifted_stats(z, e)
    margin = max_prob * (1.0 - float(np.exp(second)))
    zx = float(z[token])
    if temperature > 0 and temperature != 1.0:
        np.multiply(z, np.float32(1.0 / temperature), out=e)
        np.exp(e, out=e)
        log_q = zx / temperature - float(np.log(float(e.sum())))
    else:
        log_q = zx - float(np.log(s))
    ratio = float(np.exp(zx / temperature)) if temperature > 0 else float(np.exp(zx))
    return max_prob, entropy, margin, log_q, ratio
