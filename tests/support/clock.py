"""A clock for a reply's timings that only model calls move (`DecodeContext.clock`), so a test
checks how the engine accounts for time against known charges, never this machine's speed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

# seconds one call costs: (tokens decoded, logits rows asked for, depth of context before them)
Charge = Callable[[int, int, int], float]


class CallClock:
    """Reads `now`, which moves only when a charged model's `sync` runs (by its charge)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.charged: dict[str, float] = {}  # seconds charged, per name given to `charge`

    def __call__(self) -> float:
        return self.now

    def charge(self, monkeypatch: pytest.MonkeyPatch, model: object, name: str,
               cost: float | Charge) -> None:
        """Every `sync` of `model` (until the test ends) moves the clock by `cost` seconds, or
        by cost(n, rows, depth) for a call that decoded n tokens after `depth` of context."""
        real = model.sync  # type: ignore[attr-defined]
        self.charged.setdefault(name, 0.0)

        def sync(context, *, n_logits: int = 1, hidden: bool = False, on_progress=None):  # type: ignore[no-untyped-def]
            out = real(context, n_logits=n_logits, hidden=hidden, on_progress=on_progress)
            n = model.last_decoded  # type: ignore[attr-defined]
            seconds = cost(n, min(n_logits, n), len(context) - n) if callable(cost) else cost
            self.now += seconds
            self.charged[name] += seconds
            return out

        monkeypatch.setattr(model, "sync", sync)

    def charge_verifier(self, monkeypatch: pytest.MonkeyPatch, verifier: object,
                        seconds: float) -> list[float]:
        """Every `score` of `verifier` moves the clock by `seconds`; returns the scores given, in
        order (a count of the verifier's calls)."""
        real = verifier.score  # type: ignore[attr-defined]
        scores: list[float] = []
        self.charged.setdefault("verifier", 0.0)

        def score(features):  # type: ignore[no-untyped-def]
            value = real(features)
            self.now += seconds
            self.charged["verifier"] += seconds
            scores.append(float(value))
            return value

        monkeypatch.setattr(verifier, "score", score)
        return scores
