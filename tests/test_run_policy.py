"""SPRINTER's run policy, and the places that walk it instead of restating it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sprinter_edge.costs import Evidence, Rate
from sprinter_edge.costs.table import CostTable
from sprinter_edge.decoding.run_policy import RunPolicy, Verdict
from sprinter_edge.decoding.sprinter import FLAG_RATE, FLAGGED_ACCEPT
from sprinter_edge.planning.planner import Planner
from sprinter_edge.training.collect import simulated_run_position


def test_verdicts_cap_first_then_unscored_then_the_threshold() -> None:
    run_policy = RunPolicy(threshold=0.5, run_cap=3)
    assert run_policy.verdict(1, 0.9) is Verdict.KEPT
    assert run_policy.verdict(1, 0.1) is Verdict.FLAGGED
    assert run_policy.verdict(2, None) is Verdict.UNSCORED
    assert run_policy.verdict(3, 0.9) is Verdict.CAPPED  # the third token of a cap-3 run is verified
    calls: list[int] = []
    assert run_policy.verdict(3, lambda: calls.append(1) or 0.9) is Verdict.CAPPED
    assert calls == []  # a capped token is never scored (the verifier's time is spent only where read)
    assert RunPolicy(0.5, None).verdict(10_000, 0.9) is Verdict.KEPT


def test_walk_resets_the_run_after_every_target_call_and_at_trajectory_starts() -> None:
    run_policy = RunPolicy(threshold=0.5, run_cap=3)
    scores = [0.9, 0.9, 0.9, 0.9, 0.1, 0.9, None, 0.9, 0.9]
    starts = [True, False, False, False, False, False, False, True, False]
    got = list(run_policy.walk(scores, starts))
    assert [v for v, _ in got] == [Verdict.KEPT, Verdict.KEPT, Verdict.CAPPED, Verdict.KEPT, Verdict.FLAGGED,
                                   Verdict.KEPT, Verdict.UNSCORED, Verdict.KEPT, Verdict.KEPT]
    assert [r for _, r in got] == [0, 1, 2, 0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize("cap", [1, 2, 5, 20, None])
@pytest.mark.parametrize("f", [0.0, 0.05, 0.3, 1.0])
def test_run_lengths_are_the_truncated_geometric(cap: int | None, f: float) -> None:
    got = dict(RunPolicy(0.0, cap).run_lengths(f))
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-7)
    longest = (cap or 64) - 1
    assert max(got) <= longest
    for kept, p in got.items():
        want = (1 - f) ** kept * (f if kept < longest else 1.0)
        assert p == pytest.approx(want)


def test_the_planner_prices_the_policys_runs() -> None:
    """The planner's SPRINTER round is the expectation over `run_lengths`, nothing restated."""
    table = CostTable(last={n: 10.0 + 5.0 * n for n in (1, 2, 4, 8, 16, 32, 64)},
                      full={n: 10.0 + 6.0 * n for n in (1, 2, 4, 8, 16, 32, 64)})
    evidence = Evidence({FLAG_RATE: Rate(0.25), FLAGGED_ACCEPT: Rate(0.6)})
    planner = Planner.of(table, table, evidence=evidence, verifier_ms=0.5)
    r = planner.round_of("sprinter", run_cap=8)
    runs = list(RunPolicy(0.0, 8).run_lengths(0.25))
    assert r.tokens == pytest.approx(sum(p * (k + 1 + 0.6) for k, p in runs))
    assert r.target_ms == pytest.approx(sum(p * table.cost(k + 2, 2) for k, p in runs))
    assert r.batch == pytest.approx(sum(p * (k + 2) for k, p in runs))
    assert math.isfinite(planner.raw_ms("sprinter", run_cap=None))


def test_oracle_run_positions_walk_the_policy() -> None:
    ok = np.array([1, 1, 1, 0, 1, 1, 1, 1, 1], bool)
    assert simulated_run_position(ok, cap=3).tolist() == [0, 1, 2, 0, 0, 1, 2, 0, 1]
