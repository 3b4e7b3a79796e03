"""Scores replayed along the collected SPRINTER trajectories through the decoder's own run
policy (`decoding.run_policy`), each target call priced by a cost model, and the threshold that
matches a given target cost (what lets two candidates be compared at equal cost)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ...decoding.run_policy import RunPolicy, Verdict
from ...errors import SprinterError

# ms per target call of n tokens (logits of the last rows only) measured on the reference machine:
# the prices used when this machine's own are not measured (`verifier study --costs reference`).
DEFAULT_COST_MS = {1: 68.0, 2: 108.0, 4: 164.0, 8: 368.0, 16: 493.0, 24: 866.0}


def table_cost(table: Mapping[int, float] | None = None) -> Callable[[float], float]:
    """ms per target call of n tokens: linear between the table's rows, linear extrapolation
    beyond either end (from the two outermost rows)."""
    tab = dict(DEFAULT_COST_MS if table is None else table)
    if len(tab) < 2:
        raise SprinterError("a cost table needs at least two rows")
    xs = np.array(sorted(tab), np.float64)
    ys = np.array([tab[k] for k in sorted(tab)], np.float64)

    def cost(n: float) -> float:
        if n < xs[0]:
            return float(ys[0] + (n - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0]))
        if n > xs[-1]:
            return float(ys[-1] + (n - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        return float(np.interp(n, xs, ys))

    return cost


class _Walk:
    """The rows of a mask in runtime order, ready to be replayed at any threshold through the
    decoder's own run policy (decoding/run_policy.py): run counter, run cap, tokens the decoder
    never scores."""

    def __init__(self, data: Mapping[str, np.ndarray], mask: np.ndarray, cap: int | None,
                 cost: Callable[[float], float]) -> None:
        if cap is not None and cap < 1:
            raise SprinterError("the run cap must be at least 1")
        idx = np.flatnonzero(mask)
        order = np.lexsort((data["output_position"][idx], data["temperature"][idx],
                            data["prompt_index"][idx]))
        self.rows = idx[order]
        n = len(self.rows)
        self.n = n
        p, t = data["prompt_index"][self.rows], data["temperature"][self.rows]
        self.start = np.ones(n, bool)
        self.start[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
        self.scored = np.asarray(data["scored"])[self.rows].astype(bool)
        self.miss = 1.0 - np.clip(np.asarray(data["accept_prob"], np.float64)[self.rows], 0.0, 1.0)
        self.miss_scored = float(self.miss[self.scored].sum())
        self.groups, self.group = np.unique(np.asarray(data["group"])[self.rows], return_inverse=True)
        self.cap = cap
        self._starts = self.start.tolist()
        # ms per call of k tokens, k = 0 .. longest possible catch-up (any callable works)
        starts = np.flatnonzero(self.start)
        longest_traj = int(np.max(np.diff(np.append(starts, n)))) if n else 0
        longest = (cap + 1) if cap is not None else (longest_traj + 2)
        self.lut = np.array([float(cost(k)) for k in range(longest + 2)], np.float64)

    def replay(self, s: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """(kept, call_ms) per row for scores `s` in walk order: a row is either kept or sent
        to the target, and call_ms is what that target call costs (the run's kept tokens, this
        one and the previous call's bonus token)."""
        scores = [v if ok else None for v, ok in zip(s.tolist(), self.scored.tolist(), strict=True)]
        walked = list(RunPolicy(threshold, self.cap).walk(scores, self._starts))
        verdicts = np.fromiter((v for v, _ in walked), np.int8, self.n)
        run = np.fromiter((r for _, r in walked), np.int64, self.n)
        kept = verdicts == Verdict.KEPT
        call_ms = np.where(kept, 0.0, self.lut[np.minimum(run + 2, len(self.lut) - 1)])
        return kept, call_ms

    def totals(self, s: np.ndarray, threshold: float) -> dict[str, float]:
        kept, call_ms = self.replay(s, threshold)
        n = max(self.n, 1)
        fp = float(self.miss[kept].sum())
        calls = int(self.n - kept.sum())
        n_scored = max(int(self.scored.sum()), 1)
        flagged = int((self.scored & ~(s >= threshold)).sum())
        return {
            "tokens": int(self.n), "target_calls": calls, "target_ms": float(call_ms.sum()),
            "false_passes": fp, "kept": int(kept.sum()),
            "target_calls_per_token": calls / n, "target_ms_per_token": float(call_ms.sum()) / n,
            "false_pass_per_token": fp / n,
            "eta_fp": fp / self.miss_scored if self.miss_scored > 0 else float("nan"),
            "flag_rate": flagged / n_scored,
        }

    def group_sums(self, s: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """Per test group: (false passes, target ms) -- what the bootstrap reweights."""
        kept, call_ms = self.replay(s, threshold)
        g = len(self.groups)
        return (np.bincount(self.group, weights=self.miss * kept, minlength=g),
                np.bincount(self.group, weights=call_ms, minlength=g))


def _ordered(scores: np.ndarray, walk: _Walk, n_data: int) -> np.ndarray:
    """Scores in walk order; `scores` holds either one value per data row or per masked row."""
    scores = np.asarray(scores, np.float64)
    if len(scores) == n_data:
        return scores[walk.rows]
    if len(scores) == walk.n:  # aligned with the mask's rows in data order
        return scores[np.argsort(np.argsort(walk.rows))]
    raise SprinterError(f"{len(scores)} scores for {n_data} rows ({walk.n} in the mask)")


def simulate(scores: np.ndarray, data: Mapping[str, np.ndarray], mask: np.ndarray, threshold: float,
             cost: Callable[[float], float] | None = None, cap: int | None = 16) -> dict[str, float]:
    """Replay SPRINTER along every (prompt_index, temperature) trajectory in `mask`.

    Per drafted token, with r tokens kept since the last target call: r + 1 >= cap or
    scored == 0 -> the target is called; score >= threshold -> kept (false pass 1 - accept_prob);
    else flagged -> the target is called. A call costs cost(r + 2) ms (r pending tokens, the
    flagged one, the previous step's bonus token) and resets r. `scores` has one value per
    data row (or per masked row, in data order)."""
    walk = _Walk(data, np.asarray(mask, bool), cap, cost or table_cost())
    return walk.totals(_ordered(scores, walk, len(mask)), threshold)


def _match(walk: _Walk, s: np.ndarray, target_ms: float) -> float:
    """The threshold whose target ms (total over the walk) is closest to `target_ms`: bisection
    over the candidate's sorted distinct scores (cost grows with the threshold)."""
    cands = np.append(np.unique(s[walk.scored & np.isfinite(s)]), np.inf)
    memo: dict[int, float] = {}

    def ms(k: int) -> float:
        if k not in memo:
            memo[k] = float(walk.replay(s, cands[k])[1].sum())
        return memo[k]

    lo, hi = 0, len(cands) - 1
    if ms(lo) >= target_ms:
        return float(cands[lo])
    if ms(hi) <= target_ms:
        return float(cands[hi])
    while hi - lo > 1:  # invariant: ms(lo) < target <= ms(hi)
        mid = (lo + hi) // 2
        if ms(mid) >= target_ms:
            hi = mid
        else:
            lo = mid
    return float(cands[lo] if abs(ms(lo) - target_ms) <= abs(ms(hi) - target_ms) else cands[hi])
