"""The sampling transforms and the speculative acceptance test, on exact distributions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

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
