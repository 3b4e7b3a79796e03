"""The sampling transforms and the speculative acceptance test, on exact distributions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from support.exactness import penalised_reference

from sprinter_edge.decoding.sampling import Sampler, SamplingParams, distribution
from sprinter_edge.numerics import confidence

ALPHA = 1e-3  # significance level of every statistical test in this file


def test_greedy_prepare_is_argmax() -> None:
    s = Sampler(SamplingParams(temperature=0))
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert s.prepare(logits) == 1
    assert s.verify(1, 1, 1) == (True, None)
    assert s.verify(2, 1, 2) == (False, 1)


def test_top_k_and_top_p_masks() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.allclose(p, [2 / 3, 1 / 3, 0, 0])
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert np.allclose(p, [2 / 3, 1 / 3, 0, 0])  # smallest set reaching 0.7: {0, 1}
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.76))
    assert np.count_nonzero(p) == 3
    hot = distribution(logits, SamplingParams(temperature=2.0))
    assert hot[0] < 0.5 and np.isclose(hot.sum(), 1)


def test_confidence_matches_definition() -> None:
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    max_prob, entropy = confidence(logits)
    assert max_prob == pytest.approx(p.max(), rel=1e-6)
    assert entropy == pytest.approx(-(p * np.log(p)).sum(), rel=1e-6)


@pytest.mark.parametrize("seed", [1, 2])
def test_speculative_test_yields_target_distribution(seed: int) -> None:
    """Draw x ~ q, run the p/q test: accepted-or-resampled tokens must follow p exactly."""
    rng = np.random.default_rng(seed)
    n = 12
    p = rng.dirichlet(np.ones(n) * 0.7)
    q = rng.dirichlet(np.ones(n) * 0.7)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed))
    draws = 40_000
    counts = np.zeros(n)
    rejects = 0
    for _ in range(draws):
        x = sampler.draw(q)
        ok, replacement = sampler.verify(x, p, q)
        counts[x if ok else replacement] += 1
        rejects += not ok
    chi2 = stats.chisquare(counts, p * draws)
    assert chi2.pvalue > ALPHA, (counts / draws, p)
    # and the test really rejected sometimes (1 - sum(min(p, q)) = TV(p, q))
    tv = 0.5 * np.abs(p - q).sum()
    assert rejects / draws == pytest.approx(tv, abs=0.02)


def test_params_validation() -> None:
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)


# ---------------------------------------------------------------------------- penalties


@pytest.mark.parametrize("repeat_last_n", [64, 3, -1, 0])
def test_penalties_match_their_definition_as_contexts_grow_and_shrink(repeat_last_n: int) -> None:
    """The incremental counts stay right through what a speculative strategy does: rows for
    the committed tokens plus 0..4 drafted ones, then a commit of part of the draft."""
    rng = np.random.default_rng(repeat_last_n + 7)
    vocab = 40
    params = SamplingParams(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.3,
                            repeat_penalty=1.3, repeat_last_n=repeat_last_n)
    sampler = Sampler(params)
    prompt = [int(t) for t in rng.integers(0, vocab, 10)]
    sampler.start(prompt)
    committed = list(prompt)
    for _ in range(150):
        drafted = [int(t) for t in rng.integers(0, vocab, int(rng.integers(0, 5)))]
        for i in range(len(drafted) + 1):
            context = committed + drafted[:i]
            row = rng.normal(size=vocab).astype(np.float32)
            want = penalised_reference(row, context, len(prompt), params)
            assert np.allclose(sampler.penalise(row, context), want, atol=1e-5)
        committed += drafted[:int(rng.integers(0, len(drafted) + 1))] + [int(rng.integers(0, vocab))]
    # an unrelated context, and a tuple, are counted from scratch
    for context in (prompt + [int(t) for t in rng.integers(0, vocab, 30)], tuple(prompt)):
        row = rng.normal(size=vocab).astype(np.float32)
        want = penalised_reference(row, list(context), len(prompt), params)
        assert np.allclose(sampler.penalise(row, context), want, atol=1e-5)


def test_penalties_apply_before_the_argmax_and_leave_the_row_alone() -> None:
    logits = np.array([2.0, 1.9, 0.5, -1.0], np.float32)
    raw = logits.copy()
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.5))
    s.start([3])
    assert s.prepare(logits, [3]) == 0
    assert s.prepare(logits, [3, 0]) == 1  # token 0 was generated: 2.0 - 0.5 < 1.9
    assert s.prepare(logits, [0]) == 0  # the prompt does not count for OpenAI's penalties
    np.testing.assert_array_equal(logits, raw)
    r = Sampler(SamplingParams(temperature=0, repeat_penalty=1.1, repeat_last_n=2))
    r.start([0, 3])
    assert r.prepare(logits, [0, 3]) == 1  # the repeat penalty reads the prompt: 2.0 / 1.1 < 1.9
    assert r.prepare(logits, [0, 3, 2]) == 0  # 0 left the window of 2
    neg = np.array([-1.0, -1.05], np.float32)
    assert r.prepare(neg, [0]) == 1  # a negative logit is multiplied: -1.1 < -1.05
    off = Sampler(SamplingParams(temperature=0))
    assert off.penalise(logits, [0, 0, 0]) is logits  # no penalties: the row itself


def test_token_logprobs_match_log_softmax() -> None:
    from sprinter_edge.numerics import token_logprobs

    row = np.random.default_rng(3).normal(size=5000).astype(np.float32) * 4
    want = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    lp, top = token_logprobs(row, 17, 5)
    assert lp == pytest.approx(want[17], abs=1e-5)
    order = np.argsort(-want, kind="stable")[:5]
    assert [t for t, _ in top] == list(order)
    assert np.allclose([v for _, v in top], want[order], atol=1e-5)
    assert token_logprobs(row, 17, 0) == (pytest.approx(want[17], abs=1e-5), [])


@pytest.mark.parametrize("field, value", [
    ("logprobs", -1), ("logprobs", 21), ("presence_penalty", 2.5), ("frequency_penalty", -3),
    ("repeat_penalty", 0), ("repeat_last_n", -2)])
def test_penalty_and_logprob_validation(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
