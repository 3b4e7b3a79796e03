"""Copies across requests: earlier replies are a copy source after the prompt, within a token
budget, and the output stays the target's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sprinter_edge import Engine, SamplingParams
from sprinter_edge.costs import CostTable
from sprinter_edge.decoding.proposers.prompt_lookup import SEPARATOR, SuffixIndex
from sprinter_edge.decoding.proposers.reply_memory import LEAD, ReplyMemory
from sprinter_edge.planning.planner import Planner

PROMPT = "List the first twelve prime numbers, one per line, with a short note on each."
OTHER = "Name three rivers of Europe and the seas they flow into."
TABLE = CostTable(last={1: 10.0, 64: 80.0}, full={1: 10.0, 64: 80.0})  # as test_prediction's


def test_memory_keeps_replies_behind_their_leads_within_the_budget() -> None:
    memory = ReplyMemory(budget_tokens=LEAD + 20)
    prompt = list(range(100, 100 + 2 * LEAD))
    memory.remember(prompt, [1, 2, 3])  # too short to be worth a place
    assert len(memory) == 0
    memory.remember(prompt, list(range(10)))
    assert memory.replies() == [(*prompt[-LEAD:], *range(10))] and memory.tokens == LEAD + 10
    memory.remember(prompt, list(range(20, 30)))  # both do not fit: the oldest goes
    assert memory.replies() == [(*prompt[-LEAD:], *range(20, 30))]
    memory.remember(prompt, list(range(50)))  # longer than the whole budget: not kept
    assert len(memory) == 1
    memory.clear()
    assert len(memory) == 0 and memory.tokens == 0


def test_the_same_reply_again_only_moves_to_the_front() -> None:
    memory = ReplyMemory()
    memory.remember([7], list(range(10)))
    memory.remember([7], list(range(10, 20)))
    memory.remember([7], list(range(10)))
    assert [r[1] for r in memory.replies()] == [0, 10] and memory.tokens == 22


def test_earlier_replies_are_looked_up_last_and_never_across_a_separator() -> None:
    earlier = [(1, 2, 3, 40, 41), (5, 6, 7, 50)]
    index = SuffixIndex(earlier=earlier)
    assert index.seq[:index.offset] == [1, 2, 3, 40, 41, SEPARATOR, 5, 6, 7, 50, SEPARATOR]
    index.extend([9, 1, 2, 3])
    length, end = index.match()
    assert (length, index.seq[end]) == (3, 40)  # only an earlier reply has it
    index.extend([1, 2, 3, 60, 1, 2, 3])  # now the sequence has it too: a tie goes to it
    length, end = index.match()
    assert (length, index.seq[end]) == (3, 60)
    start = index.seq.index(40)  # a copy of an earlier reply ends where that reply ends
    assert index.copy_end(start, index.offset) == index.seq.index(SEPARATOR)


@pytest.fixture
def remembering(fixture_engine: Engine) -> Iterator[Engine]:
    fixture_engine.set_planner(Planner.of(TABLE, TABLE))
    fixture_engine.reply_memory = ReplyMemory()
    try:
        yield fixture_engine
    finally:
        fixture_engine.reply_memory = None
        fixture_engine.set_planner(None)


@pytest.mark.slow
def test_a_reply_to_an_earlier_request_is_copied_and_the_output_is_the_targets(remembering: Engine) -> None:
    engine, memory = remembering, remembering.reply_memory
    assert memory is not None
    params = SamplingParams(max_tokens=64)
    engine.generate(OTHER, params, method="ar")
    memory.clear()
    plain = engine.generate(PROMPT, params, method="lookup")  # nothing to copy from yet
    engine.generate(OTHER, params, method="ar")  # another conversation in between
    again = engine.generate(PROMPT, params, method="lookup")
    assert again.token_ids == plain.token_ids  # exact: copies change the speed only
    assert len(memory) == 2
    c = again.stats.counters
    assert c.copied_accepted >= 0.8 * len(plain.token_ids) > plain.stats.counters.copied_accepted
    assert c.target_calls < plain.stats.counters.target_calls


def test_reset_caches_forgets_the_replies(remembering: Engine) -> None:
    remembering.generate(OTHER, SamplingParams(max_tokens=16), method="ar")
    assert remembering.reply_memory is not None and len(remembering.reply_memory) == 1
    remembering.reset_caches()
    assert len(remembering.reply_memory) == 0


def test_the_engine_keeps_no_reply_unless_asked(fixture_target_path, fixture_draft_path) -> None:
    assert Engine(fixture_target_path, fixture_draft_path).reply_memory is None
    assert Engine(fixture_target_path, fixture_draft_path, reply_memory_tokens=64).reply_memory is not None
