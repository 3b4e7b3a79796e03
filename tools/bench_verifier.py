#!/usr/bin/env python
"""Time one verifier score: ONNX session alone, and with the confidence features computed.

    python tools/bench_verifier.py [FILE.onnx] [--n 5000]

Default file: the default pair's shipped verifier. Prints microseconds per call.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from sprinter_edge.catalog.registry import load_registry
from sprinter_edge.verifiers.base import DraftFeatures
from sprinter_edge.verifiers.onnx import OnnxVerifier


def per_call_us(fn, n: int) -> float:
    for _ in range(min(200, n)):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", type=Path, default=None, help="verifier .onnx (default: shipped)")
    ap.add_argument("--n", type=int, default=5000, help="calls to time (default: %(default)s)")
    ap.add_argument("--vocab", type=int, default=151936, help="logits length for the confidence features")
    args = ap.parse_args()
    path = args.file or load_registry().pair("default").verifier_path()
    ver = OnnxVerifier(path)
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal(max(ver.n_embd, 1)).astype(np.float32)
    logits = rng.standard_normal(args.vocab).astype(np.float32) * 3
    cached = DraftFeatures(hidden=hidden, logits=logits, token=0, run_position=3, output_position=10)
    _ = cached.max_prob  # features computed once: time the verifier alone

    def fresh() -> float:
        return ver.score(DraftFeatures(hidden=hidden, logits=logits, token=0, run_position=3,
                                       output_position=10))

    us_model = per_call_us(lambda: ver.score(cached), args.n)
    us_full = per_call_us(fresh, max(args.n // 10, 100))
    print(f"verifier {path.name}: layout {'+'.join(ver.layout)}, model "
          f"{ver.metadata.get('sprinter.model', '?')}")
    print(f"score one token (features ready): {us_model:.1f} us = {us_model / 1000:.4f} ms")
    print(f"score one token incl. max-prob/entropy over {args.vocab} logits: {us_full:.1f} us")


if __name__ == "__main__":
    main()
