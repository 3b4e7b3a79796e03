"""Constrained decoding inside the speculative loop, on the fixture pair (SmolLM2-135M and its
first 20 blocks).

The reference is constrained `ar` spelled out here one position at a time: the target's row,
masked to the tokens the grammar allows, argmax (greedy) or the renormalised distribution
(sampled). Every exact method must give the reference's tokens under greedy decoding (the
fixture's kernels are batch-invariant, tests/test_exactness.py) and its joint distribution
when sampled; forced tokens (the grammar leaves one choice) are committed without a target
test, and the counters say how many.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
from support.costs import flat
from support.exactness import ALPHA, chisquare_pvalue, exact_joint, sample_sd

from sprinter_edge import Engine, SamplingParams
from sprinter_edge.decoding import Origin
from sprinter_edge.decoding.sampling import distribution, masked
from sprinter_edge.grammar import Constraint, compile
from sprinter_edge.planning.planner import Planner

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "colour": {"enum": ["red", "green", "blue"]}},
    "required": ["name", "age", "colour"], "additionalProperties": False}
PERSON = Constraint.json_schema(SCHEMA)
PROMPTS = (
    "Describe a person as JSON with their name, age and favourite colour.",
    # copies: lookup and staged propose spans of the prompt; the second one breaks the schema
    # (a string age, a colour outside the enum, an extra key): its spans are cut by the grammar
    'Repeat this JSON exactly: {"name": "Ann Lee", "age": 31, "colour": "green"}',
    'Repeat this JSON exactly: {"name": "Bob", "age": "old", "colour": "purple", "city": "Paris"}',
)
EXACT_METHODS = ("ar", "sd", "lookup", "staged", "auto")
MAX_TOKENS = 64


@pytest.fixture
def engine(fixture_engine: Engine):
    """The fixture engine with a machine where every proposal pays (lookup always proposes)."""
    fixture_engine.set_planner(Planner.of(flat(), flat()))
    yield fixture_engine
    fixture_engine.set_planner(None)


def _reference(engine: Engine, prompt: list[int], constraint: Constraint,
               max_tokens: int) -> tuple[list[int], bool]:
    """Constrained greedy `ar`, one decode per token: the masked row's argmax. Returns the
    reply's tokens and whether it ended with an end token."""
    grammar = compile(constraint, engine.target)
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        row = engine.target.sync(prompt + tokens, n_logits=1).logits[0]
        token = int(np.argmax(masked(row, grammar.mask())))
        assert grammar.consume([token]) == 1
        if engine.target.is_eog(token):
            return tokens, True
        tokens.append(token)
    return tokens, False


def _forced_positions(engine: Engine, constraint: Constraint, tokens: list[int], ended: bool) -> int:
    """Positions of the reply where the grammar left one choice: the mask allows exactly one
    token, or (the end token) nothing but end-of-generation."""
    grammar = compile(constraint, engine.target)
    n = 0
    for t in tokens:
        n += int(grammar.mask().sum() == 1)
        assert grammar.consume([t]) == 1
    if ended and (grammar.done() or grammar.mask().sum() == 1):
        n += 1
    return n


def _margin(engine: Engine, prompt: list[int], constraint: Constraint, tokens: list[int],
            ref: list[int]) -> str:
    """Where `tokens` leaves the reference, and the masked target's top-two logit margin there
    (a near-tie would point at batch variance, not at the algorithm)."""
    pairs = enumerate(zip(tokens, ref, strict=False))
    i = next((j for j, (a, b) in pairs if a != b), min(len(tokens), len(ref)))
    grammar = compile(constraint, engine.target)
    grammar.consume(ref[:i])
    row = masked(engine.target.sync(prompt + ref[:i], n_logits=1).logits[0], grammar.mask())
    top = np.sort(row)[-2:]
    return f"differs at {i}: top-2 masked logit margin {float(top[1] - top[0]):.4g}"


def _check_person(text: str) -> None:
    """The reply is JSON that the schema accepts (a tiny check for this schema)."""
    obj = json.loads(text)
    assert isinstance(obj, dict) and set(obj) == {"name", "age", "colour"}, obj
    assert isinstance(obj["name"], str)
    assert isinstance(obj["age"], int) and not isinstance(obj["age"], bool)
    assert obj["colour"] in ("red", "green", "blue")


# ---------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_exact_methods_match_constrained_ar(engine: Engine, text: str) -> None:
    prompt = engine.encode(text)
    ref, ended = _reference(engine, prompt, PERSON, MAX_TOKENS)
    assert ended, "the reference should close the object within the budget"
    recount = _forced_positions(engine, PERSON, ref, ended)
    assert recount > 0
    params = SamplingParams(max_tokens=MAX_TOKENS, constraint=PERSON)
    for method in EXACT_METHODS:
        result = engine.generate(prompt, params, method=method)
        assert result.token_ids == ref, (method, _margin(engine, prompt, PERSON, result.token_ids, ref))
        assert result.finish_reason == "stop" and result.stats.exact, method
        _check_person(result.text)
        c = result.stats.counters
        assert 0 < c.forced <= recount, (method, c.forced, recount)
        if method == "ar":  # every forced position starts a round: all of them are free
            assert c.forced == recount
            assert c.target_calls == c.new_tokens - c.forced
        # the end token is forced too, unless a draft proposed it after the closing brace
        assert c.forced - result.origins.count(Origin.FORCED) in (0, 1), method
        d = result.stats.to_dict()
        assert {"forced", "grammar_proposed", "grammar_accepted"} <= set(d)
        # the grammar's own time: some, and within what decoding left to the model calls
        t = result.stats.timings
        assert 0 < d["grammar_seconds"] <= round(t.overhead_seconds, 4) + 1e-4, (method, d)


def test_lookup_spans_are_cut_where_the_grammar_rejects_them(engine: Engine) -> None:
    """The copy prompt that breaks the schema: lookup proposes its spans, the grammar cuts them,
    the reply still follows the schema."""
    prompt = engine.encode(PROMPTS[2])
    result = engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS, constraint=PERSON),
                             method="lookup")
    _check_person(result.text)
    assert result.stats.counters.copied_accepted > 0


def test_forced_text_costs_no_target_call(engine: Engine) -> None:
    """A regex that fixes most of the reply's text: llguidance's mask allows only the canonical
    token there, so `ar` commits those tokens without a target call; every method agrees."""
    constraint = Constraint.regex(r"The answer is: (yes|no)\.")
    prompt = engine.encode("Is the sky blue? Answer yes or no.")
    ref, ended = _reference(engine, prompt, constraint, 32)
    assert ended
    recount = _forced_positions(engine, constraint, ref, ended)
    params = SamplingParams(max_tokens=32, constraint=constraint)
    for method in EXACT_METHODS:
        result = engine.generate(prompt, params, method=method)
        assert result.token_ids == ref, (method, _margin(engine, prompt, constraint, result.token_ids, ref))
        assert result.text.startswith("The answer is: ")
    c = engine.generate(prompt, params, method="ar").stats.counters
    assert c.forced == recount >= 5 and c.target_calls == c.new_tokens - c.forced == 1, c


def test_logprobs_score_forced_tokens_too(engine: Engine) -> None:
    """With logprobs on, forced tokens go to the target (each committed token needs its row):
    proposed by the grammar, accepted, and the output is unchanged."""
    prompt = engine.encode(PROMPTS[0])
    ref, _ = _reference(engine, prompt, PERSON, MAX_TOKENS)
    result = engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS, constraint=PERSON,
                                                    logprobs=0), method="ar")
    assert result.token_ids == ref
    assert result.logprobs is not None and len(result.logprobs) == len(ref)
    c = result.stats.counters
    assert c.forced == 1  # the end token only
    assert c.grammar_proposed > 0 and c.grammar_accepted == c.grammar_proposed


def test_budget_cut_keeps_finish_reason_length(engine: Engine) -> None:
    prompt = engine.encode(PROMPTS[0])
    ref, _ = _reference(engine, prompt, PERSON, 7)
    for method in ("ar", "sd"):
        result = engine.generate(prompt, SamplingParams(max_tokens=7, constraint=PERSON), method=method)
        assert result.finish_reason == "length" and result.token_ids == ref, method


def test_approximate_and_draft_only_replies_follow_the_schema(engine: Engine) -> None:
    """SPRINTER keeps only tokens drawn from the draft's masked rows; `draft` samples them."""
    params = SamplingParams(max_tokens=MAX_TOKENS, constraint=PERSON)
    result = engine.generate(PROMPTS[0], params, method="sprinter")
    _check_person(result.text)
    assert result.stats.counters.kept > 0
    result = engine.generate(PROMPTS[0], params, method="draft")
    grammar = compile(PERSON, engine.target)
    assert grammar.consume(result.token_ids) == len(result.token_ids)


def test_unconstrained_counters_stay_zero(engine: Engine) -> None:
    result = engine.generate(PROMPTS[0], SamplingParams(max_tokens=16), method="sd")
    c = result.stats.counters
    assert c.forced == c.grammar_proposed == c.grammar_accepted == 0
    assert result.stats.timings.grammar_seconds == 0


# ---------------------------------------------------------------------------- sampled


def _exact_masked_joint(engine: Engine, prompt: list[int], constraint: Constraint,
                        params: SamplingParams, depth: int) -> dict[tuple[Hashable, ...], float]:
    """The exact distribution of the first `depth` tokens of constrained `ar`: the masked,
    renormalised target distribution expanded over its support."""
    def dist(path: list[int]) -> np.ndarray:
        grammar = compile(constraint, engine.target)
        assert grammar.consume(path) == len(path)
        row = engine.target.sync(prompt + path, n_logits=1).logits[0]
        return distribution(masked(row, grammar.mask()), params)

    return exact_joint(engine.target, prompt, params, depth, dist)


@pytest.mark.slow
def test_sampled_sd_joint_distribution_matches_constrained_ar(engine: Engine) -> None:
    """Temperature 0.8: the first two tokens of constrained `sd` (k = 2) are jointly distributed
    as constrained `ar`'s. Here the target opens with `{` or `{"` (then `name` is forced) while
    the draft almost always writes `{` and then a space the target nearly never does: accepted,
    residual and forced tokens all occur."""
    params = SamplingParams(temperature=0.8, max_tokens=2, constraint=PERSON)
    prompt = engine.encode(PROMPTS[0])
    exact = _exact_masked_joint(engine, prompt, PERSON, params, depth=2)
    n = 300
    counts, seen = sample_sd(engine, prompt, params, n)
    assert chisquare_pvalue(counts, exact, n) > ALPHA, counts
    assert min(seen[o] for o in (Origin.ACCEPTED, Origin.RESAMPLED, Origin.FORCED)) >= 20, seen
