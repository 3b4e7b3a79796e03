"""SPRINTER's operating point: how readily the verifier passes draft tokens.

A user names it one way (a raw threshold, a preset, or a maximum false-pass rate); it
becomes a threshold only together with the verifier in use, in `resolve`. This is the one
place those choices are validated and turned into a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingsError, VerifierError
from .base import Verifier
from .calibration import PRESETS, threshold_for_max_fp


@dataclass(frozen=True)
class OperatingPoint:
    """At most one of: `threshold` (flag a token whose score is below it), `preset`
    (quality | balanced | fast, from the verifier's calibration), `max_fp_rate` (the lowest
    threshold whose held-out false-pass rate is at most this). None of them: the verifier's
    default."""

    threshold: float | None = None
    preset: str | None = None
    max_fp_rate: float | None = None

    def __post_init__(self) -> None:
        given = [n for n in ("threshold", "preset", "max_fp_rate") if getattr(self, n) is not None]
        if len(given) > 1:
            raise SettingsError(f"choose one of threshold, preset, max_fp_rate (got {', '.join(given)})")
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise SettingsError(f"threshold must be in (0, 1], not {self.threshold}")
        if self.preset is not None and self.preset not in PRESETS:
            raise SettingsError(f"unknown preset {self.preset!r}: choose from {', '.join(PRESETS)}")
        if self.max_fp_rate is not None and not 0 <= self.max_fp_rate <= 1:
            raise SettingsError(f"max_fp_rate must be in [0, 1], not {self.max_fp_rate}")

    @property
    def is_set(self) -> bool:
        """The user chose an operating point (approximate decoding was asked for)."""
        return any(v is not None for v in (self.threshold, self.preset, self.max_fp_rate))

    def resolve(self, verifier: Verifier, domain: str | None = None, regime: str | None = None) -> float:
        """The threshold this operating point means for `verifier` (for a request of this
        domain, code or chat, and sampling regime, greedy or sampled, where the verifier
        has presets calibrated per domain)."""
        if self.threshold is not None:
            return self.threshold
        if self.max_fp_rate is not None:
            rows = getattr(verifier, "calibration", None)
            if not rows:
                raise VerifierError(
                    f"verifier {verifier.name!r} has no calibration table: a maximum false-pass "
                    "rate needs a trained verifier (give a threshold instead)")
            return threshold_for_max_fp(rows, self.max_fp_rate)
        return verifier.threshold_for(self.preset, domain, regime)

    def describe(self) -> str:
        if self.threshold is not None:
            return f"threshold {self.threshold:g}"
        if self.preset is not None:
            return f"preset {self.preset}"
        if self.max_fp_rate is not None:
            return f"max false-pass rate {self.max_fp_rate:g}"
        return "the verifier's default"
