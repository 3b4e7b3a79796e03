"""OpenAI Predicted Outputs: the client's expected text is the copy proposers' first source,
the output stays the target's, and the usage counts what the reply used."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sprinter_edge import Engine, SamplingParams
from sprinter_edge.costs import CostTable
from sprinter_edge.decoding.proposers.prompt_lookup import SEPARATOR, SuffixIndex
from sprinter_edge.decoding.stats import PredictionUsage
from sprinter_edge.planning.planner import Planner

PROMPT = "List the first twelve prime numbers, one per line, with a short note on each."
# Batched calls as a CPU times them when nothing else runs (a 64-row check costs 8 steps): these
# tests are about what a prediction does to the copy, not about this machine's costs, so they do
# not depend on a table timed while the machine was busy
TABLE = CostTable(last={1: 10.0, 64: 80.0}, full={1: 10.0, 64: 80.0})


@pytest.fixture
def priced(fixture_engine: Engine) -> Iterator[Engine]:
    fixture_engine.set_planner(Planner.of(TABLE, TABLE))
    try:
        yield fixture_engine
    finally:
        fixture_engine.set_planner(None)


def test_the_index_matches_the_source_first_and_never_across_it() -> None:
    index = SuffixIndex([5, 6, 7, 8, 9])
    index.extend([1, 2, 5, 6, 7])
    length, end = index.match()
    assert (length, index.seq[end]) == (3, 8)  # what followed 5 6 7 in the prediction
    assert index.seq[index.offset - 1] == SEPARATOR
    index.extend([3, 3, 3])  # another sequence: the source stays, the rest is indexed anew
    assert index.seq[:index.offset] == [5, 6, 7, 8, 9, SEPARATOR] and index.seq[index.offset:] == [3, 3, 3]


def test_usage_counts_prediction_tokens_used_in_order() -> None:
    assert PredictionUsage.of([1, 2, 3, 4], [1, 2, 9, 4]) == PredictionUsage(3, 1)
    assert PredictionUsage.of([1, 2], []) == PredictionUsage(0, 2)


def test_a_prediction_is_copied_and_the_output_is_the_targets(priced: Engine) -> None:
    params = SamplingParams(max_tokens=64)
    ar = priced.generate(PROMPT, params, method="ar")
    plain = priced.generate(PROMPT, params, method="lookup")
    predicted = priced.generate(
        PROMPT, SamplingParams(max_tokens=64, prediction=ar.text), method="lookup")
    # exact: the same tokens as ar with or without the prediction
    assert plain.token_ids == ar.token_ids and predicted.token_ids == ar.token_ids
    c = predicted.stats.counters
    assert c.copied_accepted > plain.stats.counters.copied_accepted
    assert c.target_calls < plain.stats.counters.target_calls  # copied, not decoded one by one
    usage = predicted.stats.prediction
    assert usage is not None and usage.accepted_prediction_tokens >= 0.9 * len(ar.token_ids)
    assert predicted.stats.to_dict()["accepted_prediction_tokens"] == usage.accepted_prediction_tokens
    assert plain.stats.prediction is None and "accepted_prediction_tokens" not in plain.stats.to_dict()


def test_a_wrong_prediction_costs_no_token(priced: Engine) -> None:
    params = SamplingParams(max_tokens=32)
    ar = priced.generate(PROMPT, params, method="ar")
    wrong = priced.generate(
        PROMPT, SamplingParams(max_tokens=32, prediction="def f(x):\n    return x * 2\n" * 8),
        method="lookup")
    assert wrong.token_ids == ar.token_ids
    assert wrong.stats.prediction is not None and wrong.stats.prediction.rejected_prediction_tokens > 0
