"""Tests that a broken sampler fails: sampled outputs against exact distributions computed
from the fixture models' own probabilities, and greedy runs against a step-by-step
reference.

The fixture pair (SmolLM2-135M and its first 20 blocks, Q4_1) gives bit-identical logits
for any batch size (tests/test_engine.py::test_batch_invariance), so the target's
probabilities computed one position at a time here are exactly the ones `sd` and `sprinter`
see in their batched target calls. Every statistical test uses alpha = 1e-3 on fixed seeds:
the outcome is deterministic, and a correct sampler fails it with probability 1e-3 over
the choice of seeds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import pytest
from scipy import stats
from support.exactness import (
    ALPHA,
    EOG,
    chisquare_pvalue,
    exact_joint,
    next_dist,
    penalised_reference,
    reply_cell,
    sample_sd,
)

from sprinter_edge import Engine, OperatingPoint, SamplingParams
from sprinter_edge.backend.llama import LlamaModel
from sprinter_edge.decoding import Origin
from sprinter_edge.decoding.sampling import Sampler, distribution
from sprinter_edge.verifiers.base import DraftFeatures, Verifier

# The fixture draft disagrees with the target here at temperature 1 (TV of the first-token
# distributions after top-k 3: about 0.5): rejections, residual draws and bonus tokens all occur.
PROMPT = "Name a colour:"


@pytest.mark.slow
def test_sd_joint_distribution_of_three_tokens_matches_ar(fixture_engine: Engine) -> None:
    """The first three `sd` tokens at temperature 1 are jointly distributed exactly as `ar`'s.

    With k = 2 draft tokens a round the third token is the bonus token whenever both drafts
    pass, so the joint covers acceptance, residual draws after rejections at either
    position, the bonus row, and a last round shortened to the tokens still allowed. (With
    k = 4 the first round drafts all three allowed tokens and its bonus would be the fourth:
    no bonus token can fall among the first three.)"""
    engine = fixture_engine
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=3)
    prompt = engine.encode(PROMPT, chat=False)
    exact = exact_joint(engine.target, prompt, params, depth=3)
    n = 300
    counts, seen = sample_sd(engine, prompt, params, n)
    assert chisquare_pvalue(counts, exact, n) > ALPHA, counts
    # every path of the algorithm ran, often enough to weigh in the statistic
    assert seen[Origin.BONUS] >= 20 and seen[Origin.RESAMPLED] >= 100 and seen[Origin.ACCEPTED] >= 100, seen


# ---------------------------------------------------------------------------- sd, greedy


@dataclass
class GreedySD:
    """What greedy SD commits, and the decode calls it should make to get there."""

    tokens: list[int] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)
    draft_calls: list[list[int]] = field(default_factory=list)  # context of each draft decode
    target_calls: list[tuple[list[int], int]] = field(default_factory=list)  # (context, rows)


def _reference_greedy_sd(target: LlamaModel, draft: LlamaModel, prompt: list[int], k: int,
                         max_tokens: int) -> GreedySD:
    """Greedy SD spelled out one decode at a time: each round the draft's own argmax chain
    of up to k tokens (fewer at an end token or at the budget) from the committed tokens,
    then one target call on the committed tokens plus the chain with a row for each drafted
    token and one for the bonus; each drafted token is checked against the target's argmax
    after the tokens before it (computed here one position at a time)."""
    ref = GreedySD()
    tokens = ref.tokens
    while len(tokens) < max_tokens:
        chain: list[int] = []
        for _ in range(max(1, min(k, max_tokens - len(tokens)))):
            ref.draft_calls.append(prompt + tokens + chain)
            chain.append(int(np.argmax(draft.sync(prompt + tokens + chain, n_logits=1).logits[0])))
            if draft.is_eog(chain[-1]):
                break
        ref.target_calls.append((prompt + tokens + chain, len(chain) + 1))
        for proposed in chain:
            best = int(np.argmax(target.sync(prompt + tokens, n_logits=1).logits[0]))
            if best != proposed:
                tokens.append(best)
                ref.origins.append(Origin.RESAMPLED)
                break
            tokens.append(proposed)
            ref.origins.append(Origin.ACCEPTED)
            if target.is_eog(proposed):  # the last of its chain: no bonus, the reply ends
                break
        else:
            tokens.append(int(np.argmax(target.sync(prompt + tokens, n_logits=1).logits[0])))
            ref.origins.append(Origin.BONUS)
        if target.is_eog(tokens[-1]):
            break
    del ref.tokens[max_tokens:], ref.origins[max_tokens:]
    if tokens and target.is_eog(tokens[-1]):  # the end token is not part of the reply
        ref.tokens.pop()
        ref.origins.pop()
    return ref


def _recording(model: LlamaModel, calls: list, monkeypatch: pytest.MonkeyPatch,
               with_rows: bool) -> None:
    """Record the context (and rows asked for) of every `sync` of `model`."""
    sync = model.sync

    def spy(context: list[int], **kwargs):  # noqa: ANN202, ANN003
        calls.append((list(context), kwargs.get("n_logits", 1)) if with_rows else list(context))
        return sync(context, **kwargs)

    monkeypatch.setattr(model, "sync", spy)


# Raw prompts the fixture draft continues like the target now and then (on chat prompts it
# almost never gets two greedy tokens in a row right).
GREEDY_PROMPTS = ("1, 2, 3, 4, 5,", "Monday, Tuesday, Wednesday,", "January, February, March,",
                  "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")


@pytest.mark.parametrize("draft_len", [4, 2, 1])
@pytest.mark.slow
def test_sd_greedy_matches_a_step_by_step_reference(fixture_engine: Engine, draft_len: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy `sd` commits exactly the tokens and origins of SD spelled out one decode at a
    time, with exactly its decode calls: a draft context, a target row or the bonus row off
    by one, a swapped p and q, or a round of the wrong length fails here even where the
    text would stay right. (This fixture draft seldom gets 3 greedy tokens in a row right,
    so the calls, not only the acceptance pattern, are what pins rows 2 and 3 down; k = 1
    makes every accepted token a bonus round.)"""
    engine = fixture_engine
    max_tokens = 17  # not a multiple of k + 1: the last round is shortened
    seen: Counter = Counter()
    for text in GREEDY_PROMPTS:
        prompt = engine.encode(text, chat=False)
        ref = _reference_greedy_sd(engine.target, engine.draft, prompt, draft_len, max_tokens)
        draft_calls: list[list[int]] = []
        target_calls: list[tuple[list[int], int]] = []
        with monkeypatch.context() as patch:
            _recording(engine.draft, draft_calls, patch, with_rows=False)
            _recording(engine.target, target_calls, patch, with_rows=True)
            gen = engine.stream(prompt, SamplingParams(max_tokens=max_tokens), method="sd")
            gen.ctx.settings["draft_len"] = draft_len
            result = gen.consume()
        prefill = [prompt[:-1]]  # each model reads the prompt but its last token first
        assert result.token_ids == ref.tokens, text
        assert result.origins == ref.origins, text
        assert draft_calls == prefill + ref.draft_calls, text
        assert target_calls == [(prompt[:-1], 0)] + ref.target_calls, text
        assert (result.stats.counters.draft_tokens, result.stats.counters.target_calls) == (
            len(ref.draft_calls), len(ref.target_calls)), text
        seen.update(result.origins)
    assert seen[Origin.RESAMPLED] >= 5 and seen[Origin.ACCEPTED] >= 5, seen
    if draft_len <= 2:
        assert seen[Origin.BONUS] >= 3, seen


def test_verify_uses_p_and_q_where_they_belong() -> None:
    """`Sampler.verify(x, p, q)`: accept x with probability min(1, p(x) / q(x)), else draw
    from norm(max(p - q, 0)). Swapping p and q, or reading a neighbouring entry, changes
    both the acceptance rate and the replacement."""
    p = np.array([0.6, 0.1, 0.3])
    q = np.array([0.1, 0.5, 0.4])
    sampler = Sampler(SamplingParams(temperature=1.0, seed=5))
    trials = 20_000
    for token, rate in ((1, 0.1 / 0.5), (2, 0.3 / 0.4)):
        accepted = 0
        replacements: Counter = Counter()
        for _ in range(trials):
            ok, replacement = sampler.verify(token, p, q)
            accepted += ok
            if not ok:
                replacements[replacement] += 1
        assert stats.binomtest(accepted, trials, rate).pvalue > ALPHA, (token, accepted / trials)
        assert set(replacements) == {0}  # max(p - q, 0) = [0.5, 0, 0]
    assert all(sampler.verify(0, p, q)[0] for _ in range(1000))  # p(0) > q(0): always kept
    # greedy: p and q are argmaxes, and only the target's (p) decides
    greedy = Sampler(SamplingParams(temperature=0.0))
    assert greedy.verify(4, 7, 4) == (False, 7)
    assert greedy.verify(7, 7, 4) == (True, None)


# ---------------------------------------------------------------------------- sprinter


class CoinVerifier(Verifier):
    """Scores every token with a fresh uniform random number, whatever the token: it passes
    a token with probability 1 - threshold, independently of the token."""

    name = "coin"

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def score(self, features: DraftFeatures) -> float:
        return float(self.rng.random())


def _sprinter_next(p: np.ndarray, q: np.ndarray, a: float, eog: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of SPRINTER's next token (at a run position below the run cap) when
    the verifier passes a drafted token with probability `a` whatever the token, and the
    part of it that is a flagged draft token accepted by the SD test (followed by a bonus
    token). An end token is always sent to the target (`eog` marks them)."""
    flag = np.where(eog, 1.0, 1.0 - a)  # probability a drafted token goes to the SD test
    accepted = flag * np.minimum(p, q)
    rejected = float((flag * (q - np.minimum(p, q))).sum())
    residual = np.maximum(p - q, 0.0)
    out = np.where(eog, 0.0, a * q) + accepted
    if rejected > 0:
        out += rejected * residual / residual.sum()
    return out, accepted


@pytest.mark.slow
def test_sprinter_two_tokens_follow_the_pass_mixture(fixture_engine: Engine) -> None:
    """With a verifier that passes a token with probability `a` independently of it, each
    SPRINTER token is distributed as a * q + (1 - a) * p (a passed token is the draft's
    sample, a flagged one goes through the SD test, whose output follows p), except a bonus
    token, which follows p. The first two tokens cover a pass, a flag with nothing pending,
    a flag after a kept token (the catch-up reads it: its rows must line up), an SD
    rejection and a bonus token."""
    engine = fixture_engine
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=2)
    prompt = engine.encode("I like to eat", chat=False)
    threshold = 0.3
    a = 1 - threshold
    eog = np.zeros(engine.target.n_vocab, bool)
    eog[[t for t in range(eog.size) if engine.target.is_eog(t)]] = True
    p1, q1 = next_dist(engine.target, prompt, params), next_dist(engine.draft, prompt, params)
    first, bonus_after = _sprinter_next(p1, q1, a, eog)
    assert 0.5 * np.abs(first - p1).sum() > 0.2 and 0.5 * np.abs(first - q1).sum() > 0.1
    exact: dict[tuple[Hashable, ...], float] = {}
    for x1 in np.flatnonzero(first):
        x1 = int(x1)
        if eog[x1]:
            exact[(EOG,)] = exact.get((EOG,), 0.0) + float(first[x1])
            continue
        context = prompt + [x1]
        p2, q2 = next_dist(engine.target, context, params), next_dist(engine.draft, context, params)
        second = bonus_after[x1] * p2 + (first[x1] - bonus_after[x1]) * _sprinter_next(p2, q2, a, eog)[0]
        for x2 in np.flatnonzero(second):
            cell = (x1, EOG if eog[x2] else int(x2))
            exact[cell] = exact.get(cell, 0.0) + float(second[x2])
    assert abs(sum(exact.values()) - 1) < 1e-6  # float32 distributions: normalised to ~1e-7

    n = 600
    counts: Counter = Counter()
    seen: Counter = Counter()
    kept = flags = 0
    for seed in range(n):
        result = engine.generate(prompt, params.replace(seed=seed), method="sprinter",
                                 verifier=CoinVerifier(10_000 + seed),
                                 operating_point=OperatingPoint(threshold=threshold))
        counts[reply_cell(result)] += 1
        seen.update(result.origins)
        kept, flags = kept + result.stats.counters.kept, flags + result.stats.counters.flags
    assert chisquare_pvalue(counts, exact, n) > ALPHA, (counts, exact)
    assert stats.binomtest(kept, kept + flags, a).pvalue > ALPHA, (kept, flags)  # the pass rate
    assert min(seen[o] for o in (Origin.ACCEPTED, Origin.RESAMPLED, Origin.BONUS)) >= 20, seen


# ---------------------------------------------------------------------------- penalties

PENALTIES = dict(presence_penalty=0.6, frequency_penalty=0.4, repeat_penalty=1.3, repeat_last_n=16)


def _penalised_dist(model: LlamaModel, context: list[int], prompt_len: int,
                    params: SamplingParams) -> np.ndarray:
    """The target's next-token distribution after the penalties, computed here from their
    definition (tests/support/exactness.py::penalised_reference), not with the package's counts."""
    row = model.sync(context, n_logits=1).logits[0]
    z = penalised_reference(row, context, prompt_len, params)
    if params.greedy:
        out = np.zeros_like(z)
        out[int(np.argmax(z))] = 1.0
        return out
    return distribution(z, params)


@pytest.mark.parametrize("penalties", [
    PENALTIES, dict(presence_penalty=1.5, frequency_penalty=0.5), dict(repeat_penalty=1.3)])
@pytest.mark.slow
def test_greedy_penalties_sd_equals_ar_equals_a_step_by_step_reference(
        fixture_engine: Engine, penalties: dict) -> None:
    """Greedy with penalties: `ar` takes the argmax of the penalised row at every step (the
    reference recomputes it one position at a time), and `sd`, which penalises the draft's and
    the target's rows with the same context, commits exactly the same tokens."""
    engine = fixture_engine
    params = SamplingParams(max_tokens=20, **penalties)
    changed = 0
    for text in GREEDY_PROMPTS:
        prompt = engine.encode(text, chat=False)
        ar = engine.generate(prompt, params, method="ar")
        ref: list[int] = []
        while len(ref) < params.max_tokens:
            z = _penalised_dist(engine.target, prompt + ref, len(prompt), params)
            ref.append(int(np.argmax(z)))
            if engine.target.is_eog(ref[-1]):
                ref.pop()
                break
        assert ar.token_ids == ref, text
        for draft_len in (4, 2):
            gen = engine.stream(prompt, params, method="sd")
            gen.ctx.settings["draft_len"] = draft_len
            sd = gen.consume()
            assert sd.token_ids == ar.token_ids, (text, draft_len)
            assert sd.stats.counters.accepted + sd.stats.counters.resampled > 0
        plain = engine.generate(prompt, params.replace(**dict.fromkeys(
            ("presence_penalty", "frequency_penalty"), 0.0), repeat_penalty=1.0), method="ar")
        changed += plain.token_ids != ar.token_ids
    assert changed >= 2, "the penalties should change most of these greedy replies"


@pytest.mark.parametrize("penalties", [
    dict(presence_penalty=2.0, frequency_penalty=1.5), dict(repeat_penalty=1.5, repeat_last_n=8)])
@pytest.mark.slow
def test_sd_joint_distribution_with_penalties_matches_the_penalised_target(
        fixture_engine: Engine, penalties: dict) -> None:
    """Sampled with penalties, the first three `sd` tokens (k = 2: acceptances, residual draws
    at either position, bonus tokens) follow the penalised target's joint distribution,
    computed exactly from the penalties' definition; the penalties move that distribution far
    from the unpenalised one, so a sampler that ignored them would fail here. (One penalty at
    a time: the repeat penalty on this prompt suppresses the repeats within three tokens that
    the presence and frequency penalties act on.)"""
    engine = fixture_engine
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=3, **penalties)
    prompt = engine.encode("red, red, red, red,", chat=False)

    def joint(p: SamplingParams) -> dict[tuple[Hashable, ...], float]:
        out: dict[tuple[Hashable, ...], float] = {(): 1.0}
        for _ in range(3):
            grown: dict[tuple[Hashable, ...], float] = {}
            for path, weight in out.items():
                if path and path[-1] == EOG:
                    grown[path] = weight
                    continue
                dist = _penalised_dist(engine.target, prompt + list(path), len(prompt), p)  # type: ignore[arg-type]
                for x in np.flatnonzero(dist):
                    cell = path + ((EOG,) if engine.target.is_eog(int(x)) else (int(x),))
                    grown[cell] = grown.get(cell, 0.0) + weight * dist[x]
            out = grown
        return out

    exact = joint(params)
    plain = joint(params.replace(presence_penalty=0.0, frequency_penalty=0.0, repeat_penalty=1.0))
    tv = 0.5 * sum(abs(exact.get(c, 0.0) - plain.get(c, 0.0)) for c in set(exact) | set(plain))
    assert tv > 0.25, tv
    n = 300
    counts, seen = sample_sd(engine, prompt, params, n)
    assert chisquare_pvalue(counts, exact, n) > ALPHA, counts
    assert seen[Origin.RESAMPLED] >= 20 and seen[Origin.ACCEPTED] >= 20, seen


# ---------------------------------------------------------------------------- logprobs


def test_logprobs_are_the_targets_and_stay_aligned_with_the_tokens(fixture_engine: Engine) -> None:
    """`ar` and `sd` report, for every committed token, the log-softmax of the target's
    (penalised) row that scored it, with the top alternatives; stop-string trimming and
    streaming keep them aligned with token_ids. sprinter and draft refuse."""
    from sprinter_edge.errors import SettingsError

    engine = fixture_engine
    prompt = engine.encode("1, 2, 3, 4, 5,", chat=False)
    for extra in ({}, PENALTIES):
        params = SamplingParams(max_tokens=12, logprobs=3, **extra)
        ar = engine.generate(prompt, params, method="ar")
        sd = engine.generate(prompt, params, method="sd")
        assert sd.token_ids == ar.token_ids and len(ar.logprobs) == len(ar.token_ids) == 12
        for i, (a, s) in enumerate(zip(ar.logprobs, sd.logprobs, strict=True)):
            context = prompt + ar.token_ids[:i]
            row = engine.target.sync(context, n_logits=1).logits[0].astype(np.float64)
            if extra:
                row = penalised_reference(row, context, len(prompt), params)
            want = row - np.log(np.exp(row - row.max()).sum()) - row.max()
            assert a.token == s.token == ar.token_ids[i]
            assert a.logprob == pytest.approx(want[a.token], abs=1e-4)
            assert s.logprob == pytest.approx(a.logprob, abs=1e-4)
            top = np.argsort(-want, kind="stable")[:3]
            assert [t for t, _ in a.top] == [t for t, _ in s.top] == list(top)
            assert a.top[0][1] >= a.logprob - 1e-6  # greedy: the chosen token is the top one
    # a stop string cuts the tokens; the logprobs follow, in the result and in the chunks
    full = engine.generate(prompt, SamplingParams(max_tokens=12, logprobs=0), method="sd")
    stop = full.text[6:9]
    gen = engine.stream(prompt, SamplingParams(max_tokens=12, logprobs=0, stop=(stop,)), method="sd")
    chunks = list(gen)
    cut = gen.result
    assert cut.finish_reason == "stop" and len(cut.token_ids) < len(full.token_ids)
    assert [e.token for e in cut.logprobs] == cut.token_ids
    assert [e for c in chunks for e in c.logprobs] == cut.logprobs
    assert all(e.top == () for e in cut.logprobs)
    for method in ("sprinter", "draft"):
        with pytest.raises(SettingsError, match="logprobs need an exact method"):
            engine.generate(prompt, SamplingParams(max_tokens=4, logprobs=1), method=method)
