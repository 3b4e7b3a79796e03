"""Decoding strategies on the real fixture pair (SmolLM2-135M and a truncated draft of it).

The fixture's Q4_1 kernels give bit-identical logits for any batch size (checked in
test_batch_invariance below), so exactness here is exact, not approximate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from support.clock import CallClock

from sprinter_edge import Engine, OperatingPoint, SamplingParams
from sprinter_edge.decoding import Origin
from sprinter_edge.decoding.sampling import distribution
from sprinter_edge.errors import ContextOverflowError, SettingsError, SprinterError
from sprinter_edge.verifiers.simple import AlwaysFlag, NeverFlag, Oracle

PROMPTS = (Path(__file__).parent / "data" / "prompts_equivalence.txt").read_text().splitlines()
ALPHA = 1e-3
HALF = OperatingPoint(threshold=0.5)


def test_batch_invariance(fixture_engine: Engine) -> None:
    """The premise of the exact tests: one batch gives the same logits as token-by-token."""
    model = fixture_engine.target
    tokens = model.tokenize("def add(a, b):\n    return a + b\n\nprint(add(2, 3))")
    model.sync(tokens[:4], n_logits=0)
    one_by_one = [model.eval([t]).logits[0] for t in tokens[4:]]
    model.rollback(4)
    batched = model.eval(tokens[4:], n_logits=len(tokens) - 4).logits
    assert np.array_equal(np.stack(one_by_one), batched)


@pytest.mark.slow
def test_sd_greedy_is_token_identical_to_ar(fixture_engine: Engine) -> None:
    assert len(PROMPTS) >= 20
    rejections = 0
    for prompt in PROMPTS:
        ar = fixture_engine.generate(prompt, SamplingParams(max_tokens=24), method="ar")
        sd = fixture_engine.generate(prompt, SamplingParams(max_tokens=24), method="sd")
        assert sd.token_ids == ar.token_ids, prompt
        assert sd.text == ar.text
        rejections += sd.stats.counters.resampled
    assert rejections > 20  # the fixture draft disagrees often: the reject path ran


def _counters_add_up(result, clock) -> None:  # noqa: ANN001
    """Token counters and timers of a reply without stop strings, timed by `clock`
    (`_charged_clock`: a target call 1 s, a draft call 1/4 s, a verifier score 1/8 s)."""
    s = result.stats
    c, t = s.counters, s.timings
    produced = c.target_sampled + c.draft_sampled + c.kept + c.accepted + c.resampled + c.bonus
    eog = 1 if result.finish_reason == "stop" else 0  # the end token is counted, not kept
    assert produced == s.new_tokens == len(result.token_ids) + eog == len(result.origins) + eog
    for origin in Origin:
        assert result.origins.count(origin) <= getattr(c, _COUNTER[origin])
    # each model's time is its calls' (the prompt's reading apart), the verifier's its scores',
    # and the total is every second charged, each counted once: on this clock the driver's own
    # work (sampling, text, bookkeeping) takes none. How large that work is on a real CPU is the
    # bench's "time d/t/v/o %" column, not a bound here.
    assert t.target_seconds == c.target_calls * 1.0
    assert t.draft_seconds == c.draft_calls * 0.25
    assert t.verifier_seconds == clock.charged["verifier"]
    assert clock.charged["verifier"] == 0 or s.method == "sprinter"
    models = clock.charged["target"] + clock.charged["draft"]
    assert t.prefill_seconds + t.target_seconds + t.draft_seconds == models
    assert t.prefill_seconds > 0  # the prompt was read
    assert t.total_seconds == sum(clock.charged.values())
    assert t.overhead_seconds == 0.0


def _charged_clock(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> CallClock:
    """A clock that only the engine's model calls and verifier scores move, by fixed charges."""
    clock = CallClock()
    clock.charge(monkeypatch, engine.target, "target", 1.0)
    clock.charge(monkeypatch, engine.draft, "draft", 0.25)
    clock.charge_verifier(monkeypatch, engine.verification.verifier, 0.125)
    return clock


_COUNTER = {Origin.TARGET: "target_sampled", Origin.DRAFT: "draft_sampled", Origin.KEPT: "kept",
            Origin.ACCEPTED: "accepted", Origin.RESAMPLED: "resampled", Origin.BONUS: "bonus",
            Origin.FORCED: "forced", Origin.COPIED: "accepted", Origin.GUIDED: "accepted"}


def _sd_rounds(origins: list[Origin]) -> list[list[Origin]]:
    """An sd reply's tokens by round: accepted drafts, then a resampled or bonus token (the
    last round may be cut short by the budget)."""
    rounds: list[list[Origin]] = [[]]
    for origin in origins:
        rounds[-1].append(origin)
        if origin in (Origin.RESAMPLED, Origin.BONUS):
            rounds.append([])
    return [r for r in rounds if r]


@pytest.mark.parametrize("method", ["ar", "draft", "sd", "sprinter"])
def test_counters_are_consistent(fixture_engine: Engine, method: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    max_tokens = 40
    clock = _charged_clock(fixture_engine, monkeypatch)
    gen = fixture_engine.stream(PROMPTS[0], SamplingParams(max_tokens=max_tokens), method=method)
    gen.ctx.clock = clock
    result = gen.consume()
    _counters_add_up(result, clock)
    s = result.stats
    if method == "ar":
        assert s.counters.target_calls == s.new_tokens and s.counters.draft_calls == 0
    if method == "draft":
        assert s.counters.target_calls == 0 and s.counters.draft_calls == s.new_tokens
    if method == "sprinter":
        # every target call is one catch-up: one SD test each
        assert s.counters.target_calls == s.counters.pq_tests == s.counters.accepted + s.counters.resampled
        assert s.counters.flags + s.counters.cap_hits + s.counters.eog_checks == s.counters.pq_tests
        assert s.counters.draft_calls == s.counters.draft_tokens == s.counters.kept + s.counters.pq_tests
    if method == "sd":
        k = fixture_engine.settings.draft_len
        assert result.finish_reason == "length"  # every round is in `origins`
        rounds = _sd_rounds(result.origins)
        assert s.counters.target_calls == len(rounds)  # one target call a round
        assert s.counters.draft_calls == s.counters.draft_tokens  # one draft call a drafted token
        low = high = produced = 0
        for r in rounds:
            accepted = r.count(Origin.ACCEPTED)
            assert r[:accepted] == [Origin.ACCEPTED] * accepted
            drafts = min(k, max_tokens - produced)  # what the round may draft
            if r[-1] is Origin.BONUS:  # every draft passed: exactly `accepted` were drafted
                assert accepted == drafts
                low, high = low + accepted, high + accepted
            else:  # rejected (or cut by the budget) after `accepted`
                assert accepted < drafts or r[-1] is Origin.ACCEPTED
                low, high = low + len(r), high + drafts
            produced += len(r)
        assert low <= s.counters.draft_tokens <= high


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.8, 7), (1.0, 11)])
@pytest.mark.slow
def test_sprinter_always_flag_equals_sd_k1(fixture_engine: Engine, temperature: float, seed: int) -> None:
    for prompt in PROMPTS[:5]:
        params = SamplingParams(max_tokens=24, temperature=temperature, seed=seed)
        sd = fixture_engine.stream(prompt, params, method="sd")
        sd.ctx.settings["draft_len"] = 1
        sd_result = sd.consume()
        spr = fixture_engine.generate(prompt, params, method="sprinter", verifier=AlwaysFlag(),
                                      operating_point=HALF)
        assert spr.token_ids == sd_result.token_ids, prompt
        assert spr.stats.counters.kept == 0


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.9, 3)])
@pytest.mark.slow
def test_sprinter_never_flag_without_cap_equals_draft(fixture_engine: Engine, temperature: float,
                                                      seed: int) -> None:
    for prompt in PROMPTS[:5]:
        params = SamplingParams(max_tokens=30, temperature=temperature, seed=seed)
        draft = fixture_engine.generate(prompt, params, method="draft")
        gen = fixture_engine.stream(prompt, params, method="sprinter", verifier=NeverFlag(),
                                    operating_point=HALF)
        gen.ctx.settings["run_cap"] = None
        gen.ctx.settings["verify_eog"] = False
        spr = gen.consume()
        assert spr.token_ids == draft.token_ids, prompt
        assert spr.stats.counters.target_calls == 0


@pytest.mark.slow
def test_oracle_sprinter_reproduces_ar_with_few_target_calls(fixture_engine: Engine) -> None:
    for prompt in PROMPTS[:4]:
        ar = fixture_engine.generate(prompt, SamplingParams(max_tokens=32), method="ar")
        spr = fixture_engine.generate(prompt, SamplingParams(max_tokens=32), method="sprinter",
                                      verifier=Oracle(ar.token_ids), operating_point=HALF)
        assert spr.token_ids == ar.token_ids
        # it flags exactly the disagreements: each flag is a rejection, every kept token is right
        assert spr.stats.counters.resampled == spr.stats.counters.flags
        assert spr.stats.counters.target_calls <= ar.stats.counters.target_calls


def test_run_cap_bounds_runs(fixture_engine: Engine) -> None:
    gen = fixture_engine.stream(PROMPTS[1], SamplingParams(max_tokens=40), method="sprinter",
                                verifier=NeverFlag(), operating_point=HALF)
    gen.ctx.settings["run_cap"] = 5
    gen.ctx.settings["verify_eog"] = False
    result = gen.consume()
    run = longest = 0
    for origin in result.origins:
        run = run + 1 if origin is Origin.KEPT else 0
        longest = max(longest, run)
    assert longest <= 4  # the 5th token of a run goes to the target
    assert result.stats.counters.cap_hits >= 1


@pytest.mark.slow
def test_sd_sampling_matches_target_distribution(fixture_engine: Engine) -> None:
    """First token of `sd` over many seeds vs the target's own distribution (chi-square)."""
    engine = fixture_engine
    params = SamplingParams(temperature=1.0, top_k=8)
    for prompt in ("Name a colour:", "The best programming language is"):
        tokens = engine.encode(prompt, chat=False)
        engine.target.reset()
        p = distribution(engine.target.sync(tokens, n_logits=1).logits[0], params)
        support = np.flatnonzero(p)
        n = 600
        counts = dict.fromkeys(support.tolist(), 0)
        rejected = 0
        for seed in range(n):
            r = engine.generate(tokens, params.replace(max_tokens=1, seed=seed), method="sd")
            counts[r.token_ids[0]] += 1
            rejected += r.stats.counters.resampled
        observed = np.array([counts[t] for t in support], float)
        expected = p[support].astype(np.float64) * n
        keep = expected >= 5
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        exp = exp * obs.sum() / exp.sum()  # p is float32: normalised to ~1e-7, chisquare wants 1.5e-8
        assert stats.chisquare(obs, exp).pvalue > ALPHA, (prompt, obs, exp)
        assert rejected > 0  # the residual path was exercised


def test_kv_cache_rollbacks_match_fresh_evaluation(fixture_engine: Engine) -> None:
    model = fixture_engine.target
    tokens = model.tokenize("Once upon a time, in a land far away, there lived a curious fox.")
    other = model.tokenize(" The weather today is cloudy with a chance of rain.")
    model.reset()
    model.sync(tokens + other, n_logits=0)
    model.rollback(5)
    model.sync(tokens[:5] + other[:3], n_logits=0)
    model.rollback(len(tokens) - 2)
    model.sync(tokens[:-2], n_logits=0)
    after = model.sync(tokens, n_logits=2).logits
    model.reset()
    fresh = model.sync(tokens, n_logits=2).logits
    assert np.allclose(after, fresh, atol=1e-4)


def test_prompt_longer_than_context(fixture_engine: Engine) -> None:
    long_prompt = "word " * 3000
    with pytest.raises(ContextOverflowError, match="context"):
        fixture_engine.generate(long_prompt, SamplingParams(max_tokens=8), method="sd")
    # the engine still works afterwards
    assert fixture_engine.generate("Hi", SamplingParams(max_tokens=4), method="sd").stats.new_tokens > 0


@pytest.mark.slow
def test_max_tokens_is_clamped_to_the_context(fixture_engine: Engine) -> None:
    prompt = "word " * 900  # ~900 tokens of a 1024 context
    result = fixture_engine.generate(prompt, SamplingParams(max_tokens=500), method="ar", chat=False)
    assert 0 < len(result.token_ids) <= 1024 - 900


def test_empty_prompt(fixture_engine: Engine) -> None:
    engine = fixture_engine
    with pytest.raises(SettingsError, match="empty"):
        engine.generate([], SamplingParams(max_tokens=6), method="sd")
    with pytest.raises(SettingsError, match="at least one message"):
        engine.chat([], SamplingParams(max_tokens=6))
    # empty raw text: the tokenizer's begin-of-sequence token alone is the prompt
    raw = engine.generate("", SamplingParams(max_tokens=6), method="sd", chat=False)
    assert engine.encode("", chat=False) == [engine.target.bos_id]
    assert raw.stats.prompt_tokens == 1
    # an empty chat message is a real prompt (the template's tokens), answered like any other
    params = SamplingParams(max_tokens=6)
    chat = engine.generate("", params, method="sd")
    assert chat.stats.prompt_tokens > 1 and chat.token_ids
    assert chat.token_ids == engine.generate("", params, method="ar").token_ids
    for result in (raw, chat):
        full = len(result.token_ids) == params.max_tokens
        assert result.finish_reason == ("length" if full else "stop")
        assert result.stats.new_tokens == len(result.token_ids) + (not full)


def test_non_ascii_text_round_trips(fixture_engine: Engine) -> None:
    text = "Größe, naïve café — 東京 🚀"
    model = fixture_engine.target
    assert model.detokenize(model.tokenize(text, add_special=False)) == text
    result = fixture_engine.generate("Réponds en français : qu'est-ce qu'un chat ? 猫",
                                     SamplingParams(max_tokens=16), method="sprinter")
    assert "\ufffd" not in result.text


def _split_characters(model, token_ids: list[int]) -> set[int]:  # noqa: ANN001
    """Character offsets of the decoded text where a token boundary falls inside the
    character's UTF-8 bytes."""
    data = b"".join(model.token_bytes(t) for t in token_ids)
    boundaries, offset = set(), 0
    for t in token_ids:
        offset += len(model.token_bytes(t))
        boundaries.add(offset)
    split, pos = set(), 0
    for i, ch in enumerate(data.decode("utf-8")):
        size = len(ch.encode("utf-8"))
        if any(pos < b < pos + size for b in boundaries):
            split.add(i)
        pos += size
    return split


def test_stop_string_cutting_a_multibyte_character(fixture_engine: Engine) -> None:
    """A stop string made of a character whose bytes two tokens share: matched on decoded
    text, never on bytes, and never leaving half a character behind."""
    engine = fixture_engine
    model = engine.target
    prompt = "Repeat exactly: 東京東京東京東京"
    base = engine.generate(prompt, SamplingParams(max_tokens=24), method="ar")
    split = _split_characters(model, base.token_ids)
    # the first split non-ASCII character after some text: the stop string
    at = next(i for i in sorted(split) if i > 0 and not base.text[i].isascii())
    stop = base.text[at]
    assert not stop.isascii() and len(stop.encode("utf-8")) > 1
    assert base.text.index(stop) == at  # the cut falls inside the split character
    cut = engine.generate(prompt, SamplingParams(max_tokens=24, stop=[stop]), method="ar")
    assert cut.finish_reason == "stop"
    assert cut.text == base.text[:at]
    assert "\ufffd" not in cut.text
    # the tokens kept are those wholly before the cut: none carries a byte of the stop
    data = [model.token_bytes(t) for t in base.token_ids]
    keep = max(k for k in range(len(data) + 1) if cut.text.encode().startswith(b"".join(data[:k])))
    assert cut.token_ids == base.token_ids[:keep] and len(cut.origins) == keep
    assert stop.encode()[:1] in data[keep]  # the next token holds the stop's first byte
    # streamed pieces join to the final text and tokens, and never split a character
    gen = engine.stream(prompt, SamplingParams(max_tokens=24, stop=[stop]), method="sd")
    chunks = list(gen)
    assert "".join(c.text for c in chunks) == gen.result.text == cut.text
    assert [t for c in chunks for t in c.token_ids] == gen.result.token_ids == cut.token_ids
    assert all("\ufffd" not in c.text for c in chunks)


def test_stop_string_trims_the_tokens(fixture_engine: Engine) -> None:
    """After a stop-string cut, token_ids (and origins) hold only the tokens whose text lies
    wholly before the cut: a token straddling the cut is dropped, its leading characters
    stay in the text."""
    engine = fixture_engine
    model = engine.target
    prompt = PROMPTS[0]
    base = engine.generate(prompt, SamplingParams(max_tokens=40), method="ar")
    pieces = [model.detokenize([t]) for t in base.token_ids]
    starts = np.cumsum([0] + [len(p) for p in pieces])
    assert model.detokenize(base.token_ids) == "".join(pieces) == base.text  # ASCII-clean reply
    # a stop at a token boundary, and one starting inside a token of 3+ characters
    j = next(i for i in range(4, len(pieces) - 1) if len(pieces[i].strip()) >= 3
             and base.text.find(pieces[i][1:] + pieces[i + 1]) == starts[i] + 1)
    cases = [(pieces[j] + pieces[j + 1], j, starts[j]),  # boundary: tokens 0..j-1 stay
             (pieces[j][1:] + pieces[j + 1], j, starts[j] + 1)]  # inside token j: it goes
    for stop, keep, at in cases:
        assert base.text.find(stop) == at
        for method in ("ar", "sd"):
            params = SamplingParams(max_tokens=40, stop=[stop])
            cut = engine.generate(prompt, params, method=method)
            assert cut.finish_reason == "stop" and cut.text == base.text[:at], (method, stop)
            assert cut.token_ids == base.token_ids[:keep], (method, stop)
            assert len(cut.origins) == keep
            assert stop not in model.detokenize(cut.token_ids)
            assert cut.stats.new_tokens > keep  # the work done is still counted
            gen = engine.stream(prompt, params, method=method)
            chunks = list(gen)
            assert [t for c in chunks for t in c.token_ids] == cut.token_ids
            assert [o for c in chunks for o in c.origins] == cut.origins
            assert "".join(c.text for c in chunks) == cut.text


def test_length_cut_inside_a_character_drops_its_bytes(fixture_engine: Engine) -> None:
    """A budget that ends in the middle of a multi-byte character: the text leaves the
    character out (no U+FFFD); every generated token stays in token_ids."""
    engine = fixture_engine
    model = engine.target
    prompt = "Translate to Japanese: I love Tokyo."
    base = engine.generate(prompt, SamplingParams(max_tokens=16), method="ar")
    # budgets after which the bytes so far end inside a character
    inside = [n for n in range(1, len(base.token_ids) + 1)
              if _incomplete(b"".join(model.token_bytes(t) for t in base.token_ids[:n]))]
    assert inside, "the reply has no token boundary inside a character"
    for n in inside[:3]:
        data = b"".join(model.token_bytes(t) for t in base.token_ids[:n])
        whole = data.decode("utf-8", errors="ignore")  # the complete characters
        for method in ("ar", "sd"):
            gen = engine.stream(prompt, SamplingParams(max_tokens=n), method=method)
            chunks = list(gen)
            result = gen.result
            assert result.finish_reason == "length"
            assert result.text == whole and "\ufffd" not in result.text, (n, method)
            assert result.token_ids == base.token_ids[:n]
            assert "".join(c.text for c in chunks) == result.text
            assert [t for c in chunks for t in c.token_ids] == result.token_ids


def _incomplete(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data"
    return False


def test_time_between_chunks_is_not_counted(fixture_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """total_seconds times the engine's own work: a consumer that waits between chunks (100 s
    a chunk on this clock, which otherwise only the model calls move) does not lower
    tokens_per_second, nor does one that stops reading and closes the stream."""
    engine = fixture_engine
    clock = _charged_clock(engine, monkeypatch)
    params = SamplingParams(max_tokens=8)
    for method in ("ar", "sprinter"):
        charged = sum(clock.charged.values())
        gen = engine.stream(PROMPTS[2], params, method=method)
        gen.ctx.clock = clock
        chunks = 0
        for _ in gen:
            clock.now += 100.0
            chunks += 1
        s = gen.result.stats
        assert chunks >= 4
        t = s.timings
        assert t.total_seconds == sum(clock.charged.values()) - charged, method
        assert t.decode_seconds >= t.draft_seconds + t.target_seconds + t.verifier_seconds
    # and one that stops reading (closes the stream) is not charged for the wait either
    charged = sum(clock.charged.values())
    gen = engine.stream(PROMPTS[2], SamplingParams(max_tokens=50), method="ar")
    gen.ctx.clock = clock
    next(iter(gen))
    busy = sum(clock.charged.values()) - charged
    clock.now += 100.0
    gen.close()
    assert gen.result.finish_reason == "cancelled"
    assert gen.result.stats.timings.total_seconds == busy


def test_unknown_method_and_bad_threshold(fixture_engine: Engine) -> None:
    with pytest.raises(SprinterError, match="unknown method"):
        fixture_engine.generate("hi", method="magic")
    with pytest.raises(SprinterError, match="threshold"):
        OperatingPoint(threshold=1.5)
    with pytest.raises(SprinterError, match="run_cap"):
        Engine.from_files(fixture_engine.target_path, method="ar", run_cap=0)


def test_streaming_can_be_cancelled(fixture_engine: Engine) -> None:
    gen = fixture_engine.stream(PROMPTS[3], SamplingParams(max_tokens=200), method="sprinter")
    for i, _ in enumerate(gen):
        if i == 2:
            break
    gen.close()
    assert gen.result is not None and gen.result.finish_reason == "cancelled"
    # closed before the first chunk: nothing decoded, still a result
    idle = fixture_engine.stream(PROMPTS[3], SamplingParams(max_tokens=200), method="sprinter")
    idle.close()
    assert idle.result is not None and idle.result.finish_reason == "cancelled"
    assert idle.result.token_ids == [] and idle.result.stats.new_tokens == 0
    # the next generation on the same models is unaffected
    again = fixture_engine.generate(PROMPTS[3], SamplingParams(max_tokens=12), method="ar")
    ref = fixture_engine.generate(PROMPTS[3], SamplingParams(max_tokens=12), method="sd")
    assert again.token_ids == ref.token_ids
