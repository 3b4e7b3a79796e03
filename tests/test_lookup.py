"""Prompt lookup and staged proposals: the matcher, the pricing, and exactness on the fixture.

Greedy: `lookup` and `staged` are token-identical to `ar` (the fixture's kernels are
batch-invariant). Sampled: a copied span is a point mass for the p/q test, so the joint
distribution of the first tokens is the target's (chi-square, alpha = 1e-3, fixed seeds).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from support.costs import flat
from support.exactness import ALPHA, PROMPTS, chisquare_pvalue, exact_joint, reply_cell

from sprinter_edge import Engine, SamplingParams
from sprinter_edge.costs.table import CostTable
from sprinter_edge.decoding.proposers.copy_evidence import CopyEvidence, bucket_of
from sprinter_edge.decoding.proposers.prompt_lookup import SuffixIndex, best_length
from sprinter_edge.decoding.sampling import Sampler
from sprinter_edge.planning.planner import Planner

COPY = ("Repeat this code exactly, in one python block:\n```python\ndef area(width, height):\n"
        "    \"\"\"The area of a rectangle.\"\"\"\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n```")


def test_suffix_index_finds_the_longest_earlier_match() -> None:
    index = SuffixIndex()
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13
    index.extend([1, 2, 3, 4, 9, 9, 2, 3, 4, 5, 6, 7, 2, 3])
    assert index.match() == (0, 0)  # the suffix (7, 2, 3) never occurred before
    index.extend(index.seq + [4])
    length, end = index.match()  # suffix ... 2 3 4: at 1-3 and at 6-8 (longer: 7? no) -> most recent
    assert length == 3 and index.seq[end:end + 3] == [5, 6, 7]
    index.extend(index.seq + [5, 6])
    length, end = index.match()  # 2 3 4 5 6 matches positions 6..10
    assert length == 5 and index.seq[end] == 7
    index.extend([8, 8, 8])  # a different sequence: indexed anew
    assert index.seq == [8, 8, 8] and index.match() == (0, 0)


def test_a_match_where_the_copy_stood_wins_over_a_longer_one() -> None:
    """Two similar functions: the first matches the suffix longer than the second one's own
    source (the reply wrote 31, the first function's token, into the second), but the copy
    stood in the second one's source: its continuation (12, not 11) is the one that goes on."""
    index = SuffixIndex()
    #  source: f1 = 30 31 2 3 4 11 50 51, f2 = 40 2 3 4 12 52;  reply: f1 as it was, then 40 31 2 3 4
    source = [30, 31, 2, 3, 4, 11, 50, 51, 40, 2, 3, 4, 12, 52]
    index.extend(source + [30, 31, 2, 3, 4, 11, 50, 51, 40, 31, 2, 3, 4])
    length, end = index.match()  # the longest: the first function ("31 2 3 4")
    assert length == 4 and index.seq[end] == 11
    length, end = index.match(near=9, window=4)  # the copy stood at the second one's source
    assert length == 3 and index.seq[end] == 12
    assert index.match(near=9, window=0) == index.match()  # no window: the longest
    assert index.match(near=0, window=2) == index.match()  # none ends near there


def test_anchor_resumes_the_copy_after_an_edit() -> None:
    index = SuffixIndex()
    # source: f ( x , y ) : ...; the reply copied "f ( x", then wrote ": int" (the edit) and ","
    #        0  1  2  3  4  5  6   7   8  9 10 11 12 13
    index.extend([5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 20, 21, 8])
    assert index.match() == (0, 0)  # "20 21 8" never occurred: no fresh match yet
    end = index.anchor(3)  # the copy stood at 3 (the "," the reply replaced)
    assert end == 4 and index.seq[end:end + 2] == [9, 10]  # resume after the source's ","
    assert index.anchor(3, window=1) == 4
    assert index.anchor(4) == 0  # no "," within the window from 4
    index.extend(index.seq + [9])  # the last two (8, 9) agree with the source at 3-4
    assert index.anchor(0) == 5


def test_pricing_follows_the_measured_curve_and_declines_what_does_not_pay() -> None:
    # compute-bound CPU: every row costs about 20 ms, one step 40 ms, and 16 rows take a
    # faster path than 12
    full = {n: 40.0 + 20.0 * (n - 1) for n in range(1, 33)}
    full[16] = full[12] - 5.0
    table = CostTable(last={n: 40.0 + 2.0 * (n - 1) for n in range(1, 33)}, full=full)
    k, ms = best_length(0.98, 20, table)
    assert k == 15 and ms < 40.0  # the dip at 16 rows wins over any shorter proposal
    assert best_length(0.4, 20, table) == (0, 40.0)  # an unsure copy is not worth a batch
    assert best_length(0.98, 20, flat())[0] == 20  # on flat costs propose all there is


def test_all_rows_costs_past_the_timed_one_row_sizes_are_kept() -> None:
    """One row timed up to 32 tokens, all rows up to 64: the 64-row cost stays as measured,
    not raised to the one-row line extrapolated past 32 (800 here), which priced long calls
    at depth 30% high."""
    table = CostTable(last={1: 50.0, 16: 200.0, 32: 400.0}, full={1: 50.0, 32: 600.0, 64: 700.0})
    table.make_monotone()
    assert table.full[64] == 700.0 and table.all_rows(64) == 700.0
    assert table.full[32] == 600.0  # where both were timed, all rows never cost less than one
    assert table.cost(64, 1) <= 700.0


def test_evidence_learns_per_bucket_and_forgets() -> None:
    ev = CopyEvidence()
    b = bucket_of(12)
    before = ev.rate(b)
    for _ in range(50):
        ev.add(b, 0, stopped=True)
    assert ev.rate(b) < 0.1 < before
    assert ev.rate(bucket_of(3)) == CopyEvidence().rate(bucket_of(3))  # other buckets untouched


def test_point_mass_proposals_keep_the_target_distribution() -> None:
    """verify(x, p, q=x): accept w.p. p(x), else draw from p without x: the output is p."""
    p = np.array([0.5, 0.3, 0.2])
    sampler = Sampler(SamplingParams(temperature=1.0, seed=3))
    n = 6000
    counts = Counter()
    for _ in range(n):
        ok, other = sampler.verify(1, p, 1)
        counts[1 if ok else other] += 1
    from scipy import stats

    obs = np.array([counts[i] for i in range(3)], float)
    assert stats.chisquare(obs, p * n).pvalue > ALPHA, counts


@pytest.fixture
def lookup_engine(fixture_engine: Engine):
    planner = Planner.of(flat(), flat())
    fixture_engine.set_planner(planner)
    yield fixture_engine
    fixture_engine.set_planner(None)


@pytest.mark.parametrize("method", ["lookup", "staged"])
@pytest.mark.slow
def test_greedy_lookup_is_identical_to_ar(lookup_engine: Engine, method: str) -> None:
    engine = lookup_engine
    params = SamplingParams(max_tokens=48)
    copied = 0
    for prompt in (COPY, *PROMPTS[:6]):
        ar = engine.generate(prompt, params, method="ar")
        got = engine.generate(prompt, params, method=method)
        assert got.token_ids == ar.token_ids, (method, prompt)
        copied += got.stats.counters.copied_accepted
        assert got.stats.exact
    assert copied > 5  # the copy prompt really ran on copied spans


@pytest.mark.slow
def test_sampled_lookup_joint_distribution_matches_ar(lookup_engine: Engine) -> None:
    engine = lookup_engine
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=3)
    # the prompt's tail occurred before, so the very first round proposes a copied span
    prompt = engine.encode("one two three four, one two three four, one two", chat=False)
    exact = exact_joint(engine.target, prompt, params, depth=3)
    n = 300
    counts: Counter = Counter()
    proposed = 0
    for seed in range(n):
        result = engine.generate(prompt, params.replace(seed=seed), method="lookup")
        counts[reply_cell(result)] += 1
        proposed += result.stats.counters.copied_tokens
    assert proposed >= n  # proposals were made and tested
    assert chisquare_pvalue(counts, exact, n) > ALPHA, counts


def test_copy_guard_never_keeps_a_copied_token(fixture_engine: Engine) -> None:
    """`guarded` with a verifier that passes everything: every token it keeps without the target
    is one that does NOT continue a verbatim span; the copies all went to the target."""
    from sprinter_edge.decoding import Origin
    from sprinter_edge.verifiers.simple import NeverFlag

    engine = fixture_engine
    prompt = engine.encode(COPY)
    result = engine.generate(prompt, SamplingParams(max_tokens=48), method="guarded", verifier=NeverFlag())
    assert not result.stats.exact and result.stats.counters.flags > 0
    index = SuffixIndex()
    kept = 0
    for i, (token, origin) in enumerate(zip(result.token_ids, result.origins, strict=True)):
        index.extend(prompt + result.token_ids[:i])
        match, end = index.match()
        if origin is Origin.KEPT:
            kept += 1
            assert not (match and end < len(index.seq) and index.seq[end] == token), i
    plain = engine.generate(prompt, SamplingParams(max_tokens=48), method="sprinter", verifier=NeverFlag())
    assert plain.stats.counters.kept > kept  # without the guard the copies are kept unchecked


EDIT = ("Add a type hint to every parameter (int) and every return (int) in this code; return the "
        "whole code in one python block:\n```python\ndef add(a, b):\n    return a + b\n\n\n"
        "def sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n```")


@pytest.mark.slow
def test_greedy_splice_writes_departures_and_is_identical_to_ar(fixture_engine: Engine) -> None:
    """Where calls cost the same whatever their size and a draft step a fifth of a target's, the
    draft writes where the reply departs from the copy; the output stays the target's."""
    engine = fixture_engine
    engine.set_planner(Planner.of(flat(10.0), flat(2.0)))
    params = SamplingParams(max_tokens=64)
    writes = 0
    for prompt in (EDIT, COPY, *PROMPTS[:3]):
        ar = engine.generate(prompt, params, method="ar")
        got = engine.generate(prompt, params, method="splice")
        assert got.token_ids == ar.token_ids, prompt
        assert got.stats.exact
        writes += got.stats.counters.writes
    engine.set_planner(None)
    assert writes > 0  # the draft wrote into proposals


def test_splice_declines_to_write_where_rows_cost_more_than_they_save(fixture_engine: Engine) -> None:
    """Compute-bound batches (each added row costs most of a step) and a draft half the
    target's price: writing is predicted dearer than plain steps, so splice runs as lookup."""
    costly = CostTable(last={n: 10.0 * n for n in range(1, 33)}, full={n: 10.0 * n for n in range(1, 33)})
    draft = CostTable(last={n: 5.0 * n for n in range(1, 33)}, full={n: 5.0 * n for n in range(1, 33)})
    fixture_engine.set_planner(Planner.of(costly, draft))
    try:
        got = fixture_engine.generate(EDIT, SamplingParams(max_tokens=64), method="splice")
    finally:
        fixture_engine.set_planner(None)
    assert got.stats.counters.writes == 0 and got.stats.counters.draft_tokens == 0
