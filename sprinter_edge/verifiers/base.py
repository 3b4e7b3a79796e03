"""What a verifier sees and what it returns.

A verifier maps the draft's view of one drafted token (its final hidden state and cheap
features of its next-token distribution) to an acceptance score in [0, 1]. SPRINTER sends
a token to the target when its score is below the threshold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from ..errors import VerifierError
from ..numerics import confidence

# Feature blocks a learned verifier may use, in this order.
FEATURE_BLOCKS = ("hidden", "max_prob", "entropy", "run_position")


@dataclass
class DraftFeatures:
    hidden: np.ndarray | None  # draft's final hidden state at the position that produced token
    logits: np.ndarray  # draft's raw logits at that position
    token: int
    run_position: int  # tokens already kept in the current run
    output_position: int  # tokens generated before this one
    _conf: tuple[float, float] | None = field(default=None, repr=False)

    def _confidence(self) -> tuple[float, float]:
        if self._conf is None:
            self._conf = confidence(self.logits)
        return self._conf

    @property
    def max_prob(self) -> float:
        return self._confidence()[0]

    @property
    def entropy(self) -> float:
        return self._confidence()[1]


def feature_vector(f: DraftFeatures, layout: tuple[str, ...]) -> np.ndarray:
    parts: list[np.ndarray] = []
    for block in layout:
        if block == "hidden":
            assert f.hidden is not None
            parts.append(f.hidden.astype(np.float32, copy=False))
        elif block == "max_prob":
            parts.append(np.array([f.max_prob], np.float32))
        elif block == "entropy":
            parts.append(np.array([f.entropy], np.float32))
        elif block == "run_position":
            parts.append(np.array([f.run_position], np.float32))
        else:
            raise ValueError(f"unknown feature block {block!r}")
    return np.concatenate(parts)


class Verifier(ABC):
    """Scores drafted tokens; higher means 'the target would accept it'."""

    name: str = ""
    needs_hidden: bool = False  # ask the draft for hidden states (a little extra work)
    default_threshold: float = 0.5
    # named operating points: quality (few false passes) .. fast (long runs)
    presets: dict[str, float] = {"quality": 0.8, "balanced": 0.5, "fast": 0.3}  # noqa: RUF012

    def threshold_for(self, preset: str | None) -> float:
        if preset is None:
            return self.default_threshold
        if preset not in self.presets:
            raise VerifierError(f"verifier {self.name!r} has no preset {preset!r} "
                                f"(it has {', '.join(self.presets) or 'none'})")
        return self.presets[preset]

    @abstractmethod
    def score(self, features: DraftFeatures) -> float: ...

    def check_pair(self, draft: object, target: object) -> None:  # noqa: B027
        """Raise VerifierError when this verifier was made for another pair."""
