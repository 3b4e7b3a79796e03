"""Does this machine compute a token's logits the same whatever the batch it is in?

Speculative decoding scores proposed tokens inside one batched call, plain decoding one token
per call. Where llama.cpp's kernels give the same row either way (batch-invariant), greedy
speculation is token-identical to plain decoding; where they do not, a near-tie between the
target's top two tokens can flip, and a long greedy reply may leave the plain path (still
exact in distribution: the p/q test is). Which of the two holds depends on the CPU, the build
and weight repacking (`SPRINTER_EDGE_EXTRA_BUFFERS`), so it is measured, not assumed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .llama import LlamaModel, LoadOptions

CONTEXT = 64  # tokens read before the compared rows
SIZES = (4, 16, 32)  # batched calls compared with one-token steps
_TEXT = ("def merge(left, right):\n    out = []\n    while left and right:\n"
         "        out.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
         "    return out + left + right\n\nThe report lists every change in the order it was made. ") * 6


@dataclass(frozen=True)
class Drift:
    """Rows computed inside a k-token call against the same rows from one-token steps."""

    k: int
    max_abs: float  # the largest logit difference in any row
    argmax_flips: int  # rows whose top token differs


@dataclass(frozen=True)
class Invariance:
    repacking: bool  # weights loaded with the extra (repacked) buffer types
    drifts: tuple[Drift, ...]

    @property
    def invariant(self) -> bool:
        return all(d.max_abs == 0.0 for d in self.drifts)

    def line(self) -> str:
        what = ", ".join(f"{d.k} tokens: {d.max_abs:.3g}" + (f" ({d.argmax_flips} top-token flips)"
                                                            if d.argmax_flips else "")
                         for d in self.drifts)
        verdict = ("batch-invariant: greedy speculation is token-identical to ar" if self.invariant
                   else "NOT batch-invariant: greedy output may leave ar's at near-ties (exact in "
                        "distribution still)")
        return f"repacking {'on ' if self.repacking else 'off'}: max logit drift {what}: {verdict}"


def drift(model: LlamaModel, sizes: Sequence[int] = SIZES) -> tuple[Drift, ...]:
    """Compare each row of a k-token call after CONTEXT tokens with the same row computed one
    token per call, for each k in `sizes`."""
    tokens = model.tokenize(_TEXT)
    longest = max(sizes)
    context, batch = tokens[:CONTEXT], tokens[CONTEXT:CONTEXT + longest]
    model.reset()
    model.sync(context, n_logits=0)
    steps = np.stack([model.eval([t], n_logits=1).logits[0].copy() for t in batch])
    out = []
    for k in sizes:
        model.rollback(CONTEXT)
        rows = model.eval(batch[:k], n_logits=k).logits
        diff = float(np.max(np.abs(rows - steps[:k])))
        flips = int(np.sum(np.argmax(rows, axis=1) != np.argmax(steps[:k], axis=1)))
        out.append(Drift(k, diff, flips))
    model.reset()
    return tuple(out)


@contextlib.contextmanager
def _repacking(on: bool) -> Iterator[None]:
    old = os.environ.get("SPRINTER_EDGE_EXTRA_BUFFERS")
    os.environ["SPRINTER_EDGE_EXTRA_BUFFERS"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["SPRINTER_EDGE_EXTRA_BUFFERS"]
        else:
            os.environ["SPRINTER_EDGE_EXTRA_BUFFERS"] = old


def measure(path: Path, options: LoadOptions, *,
            repacking: Sequence[bool] = (True, False)) -> list[Invariance]:
    """Load the model once per repacking setting and measure its drift (a few seconds each)."""
    out = []
    for on in repacking:
        with _repacking(on):
            model = LlamaModel(path, options)
        try:
            out.append(Invariance(on, drift(model)))
        finally:
            model.close()
    return out
