"""Verifiers that need no training."""

from __future__ import annotations

from collections.abc import Sequence

from .base import DraftFeatures, Verifier


class AlwaysFlag(Verifier):
    """Every token goes to the target: SPRINTER becomes SD with one draft token a round."""

    name = "always-flag"

    def score(self, features: DraftFeatures) -> float:
        return 0.0


class NeverFlag(Verifier):
    """No token goes to the target (until the run cap): the draft's own output."""

    name = "never-flag"
    default_threshold = 0.5

    def score(self, features: DraftFeatures) -> float:
        return 1.0


class Confidence(Verifier):
    """The draft's own max probability as the score (the rule llama.cpp's p_min uses)."""

    name = "confidence"
    default_threshold = 0.5

    def score(self, features: DraftFeatures) -> float:
        return features.max_prob


class Oracle(Verifier):
    """Flags exactly the tokens where the draft differs from a reference (the target's
    greedy output): with greedy decoding SPRINTER's output then equals the target's, at the
    fewest target calls any verifier can reach. For analysis and benchmarks."""

    name = "oracle"

    def __init__(self, reference: Sequence[int]):
        self.reference = list(reference)

    def score(self, features: DraftFeatures) -> float:
        i = features.output_position
        return 1.0 if i < len(self.reference) and self.reference[i] == features.token else 0.0
