"""SPRINTER's run policy, written once: what becomes of each drafted token.

A run drafts one token at a time. Each is KEPT (the verifier passed it: committed without the
target) or ends the run: FLAGGED (the verifier flagged it), CAPPED (the run reached its cap) or
UNSCORED (a token the verifier does not judge: an end token). The run's pending tokens and that
last one then go to the target in one call, and the next run starts at 0.

Everything that needs the policy walks this class: the decoder (proposers/draft.py
`VerifierRun`, which the on-policy collector runs as it is), the verifier study's replay over
collected trajectories (training/study/replay.py), the oracle run positions of the off-policy
collector (training/collect.py) and the price of a SPRINTER round (decoding/sprinter.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum


class Verdict(IntEnum):
    KEPT = 0
    FLAGGED = 1
    CAPPED = 2
    UNSCORED = 3


NO_CAP_HORIZON = 64  # without a cap, the planner's price sums runs up to this length


@dataclass(frozen=True)
class RunPolicy:
    threshold: float
    run_cap: int | None = 20  # the longest run of kept tokens is run_cap - 1

    def verdict(self, drafted: int, score: float | Callable[[], float] | None) -> Verdict:
        """The verdict on the `drafted`-th token of a run (1-based). `score`: the verifier's
        score, or a function computing it (called only when the token is judged); None: the
        verifier does not judge this token."""
        if self.run_cap is not None and drafted >= self.run_cap:
            return Verdict.CAPPED
        if score is None:
            return Verdict.UNSCORED
        value = score() if callable(score) else score
        return Verdict.KEPT if value >= self.threshold else Verdict.FLAGGED

    def walk(self, scores: Sequence[float | None], starts: Sequence[bool] | None = None
             ) -> Iterator[tuple[Verdict, int]]:
        """(verdict, tokens kept before it in its run) for each token of recorded trajectories,
        in order; `starts[i]` marks the first token of a trajectory (default: one trajectory)."""
        run = 0
        for i, s in enumerate(scores):
            if starts is not None and starts[i]:
                run = 0
            v = self.verdict(run + 1, s)
            yield v, run
            run = run + 1 if v is Verdict.KEPT else 0

    def run_lengths(self, flag_rate: float, min_prob: float = 1e-9) -> Iterator[tuple[int, float]]:
        """(kept, probability) of a run that keeps `kept` tokens and then calls the target, when
        each judged token is flagged with probability `flag_rate`, independently: the
        distribution the planner prices SPRINTER's round with."""
        cap = self.run_cap or NO_CAP_HORIZON  # without a cap, a horizon acts as one
        run_policy = RunPolicy(self.threshold, cap)
        alive = 1.0  # P(the first drafted - 1 tokens were kept)
        for drafted in range(1, cap + 1):
            if run_policy.verdict(drafted, self.threshold) is not Verdict.KEPT:
                yield drafted - 1, alive  # the run ends here whatever the score
                return
            if alive * flag_rate >= min_prob:
                yield drafted - 1, alive * flag_rate
            alive *= 1.0 - flag_rate
            if alive < min_prob:
                return
