"""Turning logits into next-token choices, identically for draft and target.

`Sampler.prepare` maps logits to what the sampler needs: the argmax under greedy
decoding, otherwise the probability vector after temperature, top-k and top-p. Both
models' logits go through the same transform, so the speculative test below is exact for
the distribution the user asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SettingsError
from ..numerics import softmax

# Candidate pool for top-p: the nucleus is searched among the most likely tokens first and
# the full vocabulary is sorted only when those do not reach top_p.
_TOP_P_POOL = 1024


@dataclass(frozen=True)
class SamplingParams:
    """What one reply may look like: length, randomness, where it stops.

    The one place the generation defaults live; the CLI, the chat REPL, the server and the
    Python API all build one of these (`replace` derives a variant)."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop before the first of these texts

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(s for s in self.stop if s))
        if self.max_tokens < 0:
            raise SettingsError("max_tokens must be >= 0")
        if self.temperature < 0:
            raise SettingsError("temperature must be >= 0")
        if self.top_k < 0:
            raise SettingsError("top_k must be >= 0")
        if not 0 < self.top_p <= 1:
            raise SettingsError("top_p must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities after temperature, top-k and top-p (float64, zeros outside)."""
    scaled = logits.astype(np.float64) / params.temperature
    n = scaled.shape[0]
    keep: np.ndarray | None = None
    if 0 < params.top_k < n:
        keep = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    if params.top_p < 1.0:
        pool = keep if keep is not None else np.argpartition(-scaled, min(_TOP_P_POOL, n) - 1)[
            : min(_TOP_P_POOL, n)
        ]
        full = softmax(scaled if keep is None else _masked(scaled, keep))
        order = pool[np.argsort(-full[pool], kind="stable")]
        cum = np.cumsum(full[order])
        if cum[-1] < params.top_p and keep is None:
            order = np.argsort(-full, kind="stable")
            cum = np.cumsum(full[order])
        cut = int(np.searchsorted(cum, params.top_p)) + 1
        keep = order[:cut]
    if keep is not None:
        scaled = _masked(scaled, keep)
    return softmax(scaled)


def _masked(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    out = np.full_like(values, -np.inf)
    out[keep] = values[keep]
    return out


class Sampler:
    """Draws tokens and runs the speculative-decoding acceptance test."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def prepare(self, logits: np.ndarray, context: Sequence[int] = ()) -> int | np.ndarray:
        """`context`: the tokens this row predicts after (what a penalty would read)."""
        if self.params.greedy:
            return int(np.argmax(logits))
        return distribution(logits, self.params)

    def draw(self, prepared: int | np.ndarray) -> int:
        if isinstance(prepared, int):
            return prepared
        # inverse CDF: rng.choice(n, p=...) re-validates p on every call (1.5 ms over 152k tokens)
        cdf = np.cumsum(prepared)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return min(i, prepared.shape[0] - 1)

    def verify(
        self, token: int, p: int | np.ndarray, q: int | np.ndarray
    ) -> tuple[bool, int | None]:
        """Speculative test of a draft token x ~ q against the target p.

        Accept with probability min(1, p(x)/q(x)); otherwise return a token drawn from
        norm(max(p - q, 0)). The result is distributed exactly as p. Under greedy decoding p
        and q are one-hot and this reduces to "accept iff the target's argmax is x"."""
        if isinstance(p, int):
            return (True, None) if p == token else (False, p)
        if isinstance(q, int):  # a point mass at x (a deterministic proposal): accept w.p. p(x)
            if self.rng.random() < p[token]:
                return True, None
            residual = p.copy()
            residual[token] = 0.0
            total = residual.sum()
            return False, self.draw(residual / total) if total > 0 else self.draw(p)
        px, qx = p[token], q[token]
        if qx <= 0:  # cannot happen for x ~ q; be safe
            return False, self.draw(p)
        if self.rng.random() < px / qx:
            return True, None
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        if total <= 0:
            return False, self.draw(p)
        return False, self.draw(residual / total)
