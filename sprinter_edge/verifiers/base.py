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
from ..numerics import confidence, token_features

# Feature blocks a learned verifier may use, in this order. All but `hidden` are one number:
# the draft's distribution at temperature 1 (max_prob, entropy, margin = top-1 minus top-2
# probability), the drawn token at the sampling temperature (logq_x, q_ratio = q(x) / max q),
# and where the run stands (kept since the last target call, since the last flag, the last
# catch-up's outcome, tokens generated so far).
FEATURE_BLOCKS = ("hidden", "max_prob", "entropy", "margin", "logq_x", "q_ratio", "run_position",
                  "since_flag", "last_accepted", "last_rejected", "output_position")
_TOKEN_BLOCKS = ("margin", "logq_x", "q_ratio")


@dataclass
class DraftFeatures:
    hidden: np.ndarray | None  # draft's final hidden state at the position that produced token
    logits: np.ndarray  # draft's raw logits at that position
    token: int
    run_position: int  # tokens already kept in the current run
    output_position: int  # tokens generated before this one
    temperature: float = 0.0  # the sampling temperature the token was drawn at (0: greedy)
    since_flag: int = 0  # tokens drafted since the last flagged one
    last_outcome: int = 0  # the last catch-up's test: 0 none yet, 1 accepted, 2 rejected
    _conf: tuple[float, float] | None = field(default=None, repr=False)
    _token: tuple[float, float, float, float, float] | None = field(default=None, repr=False)

    def _confidence(self) -> tuple[float, float]:
        if self._conf is None:
            self._conf = (self.token_features()[:2] if self._token is not None
                          else confidence(self.logits))
        return self._conf

    def token_features(self) -> tuple[float, float, float, float, float]:
        if self._token is None:
            self._token = token_features(self.logits, self.token, self.temperature)
        return self._token

    @property
    def max_prob(self) -> float:
        return self._confidence()[0]

    @property
    def entropy(self) -> float:
        return self._confidence()[1]

    def value(self, block: str) -> float:
        """One scalar feature block by name."""
        if block in ("max_prob", "entropy"):
            return self._confidence()[0 if block == "max_prob" else 1]
        if block in _TOKEN_BLOCKS:
            return self.token_features()[2 + _TOKEN_BLOCKS.index(block)]
        if block == "last_accepted":
            return float(self.last_outcome == 1)
        if block == "last_rejected":
            return float(self.last_outcome == 2)
        if block in ("run_position", "since_flag", "output_position"):
            return float(getattr(self, block))
        raise ValueError(f"unknown feature block {block!r}")


def feature_vector(f: DraftFeatures, layout: tuple[str, ...]) -> np.ndarray:
    if any(b in _TOKEN_BLOCKS for b in layout):
        f.token_features()  # one pass over the vocabulary for all of them
    parts: list[np.ndarray] = []
    for block in layout:
        if block == "hidden":
            assert f.hidden is not None
            parts.append(f.hidden.astype(np.float32, copy=False))
        else:
            parts.append(np.array([f.value(block)], np.float32))
    return np.concatenate(parts)


class Verifier(ABC):
    """Scores drafted tokens; higher means 'the target would accept it'."""

    name: str = ""
    needs_hidden: bool = False  # ask the draft for hidden states (a little extra work)
    default_threshold: float = 0.5
    # named operating points: quality (few false passes) .. fast (long runs)
    presets: dict[str, float] = {"quality": 0.8, "balanced": 0.5, "fast": 0.3}  # noqa: RUF012
    # presets calibrated per sampling regime ("greedy" | "sampled") and request domain
    # ("code" | "chat"); where one is given it wins over `presets`
    domain_presets: dict[str, dict[str, dict[str, float]]] = {}  # noqa: RUF012

    def threshold_for(self, preset: str | None, domain: str | None = None,
                      regime: str | None = None) -> float:
        if preset is None:  # the default operating point is the balanced one
            found = self._domain_preset("balanced", domain, regime)
            return self.default_threshold if found is None else found
        found = self._domain_preset(preset, domain, regime)
        if found is not None:
            return found
        if preset not in self.presets:
            raise VerifierError(f"verifier {self.name!r} has no preset {preset!r} "
                                f"(it has {', '.join(self.presets) or 'none'})")
        return self.presets[preset]

    def _domain_preset(self, preset: str, domain: str | None, regime: str | None) -> float | None:
        if domain is None or regime is None:
            return None
        return self.domain_presets.get(regime, {}).get(domain, {}).get(preset)

    @abstractmethod
    def score(self, features: DraftFeatures) -> float: ...

    def highest_score(self) -> float | None:
        """The highest score this verifier can give, where it is known (None: not known): a
        threshold above it flags every drafted token."""
        return None

    def max_prob_band(self, threshold: float) -> tuple[float, float] | None:
        """Where the score is a non-decreasing function of the draft's max probability alone:
        (lo, hi) such that a token whose max probability is below lo scores under `threshold`
        and one at or above hi reaches it, so the decoder scores only the tokens in between
        (None: not such a verifier)."""
        return None

    def check_pair(self, draft: object, target: object) -> None:  # noqa: B027
        """Raise VerifierError when this verifier was made for another pair."""
