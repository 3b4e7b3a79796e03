"""tools/replay.py without a model: the decode loop against a recorded reply, the variants, the split."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sprinter_edge.bench.edits import FUNCTIONS
from sprinter_edge.costs import Evidence
from sprinter_edge.costs.table import CostTable
from sprinter_edge.decoding.proposers.copy_evidence import ANCHOR, CopyEvidence
from sprinter_edge.decoding.proposers.prompt_lookup import PromptLookup, SuffixIndex

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.fixture(scope="module")
def replay():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("replay_tool", TOOLS / "replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["replay_tool"] = module
    spec.loader.exec_module(module)
    return module


TABLE = CostTable(last={1: 10.0, 64: 80.0}, full={1: 10.0, 64: 80.0})
PROMPT = list(range(100, 160))  # 60 distinct tokens
REPLY = [*range(100, 130), 7, 8, *range(132, 160)]  # the prompt copied, two tokens edited


def test_replay_commits_the_recorded_reply_and_counts_the_copies(replay) -> None:  # type: ignore[no-untyped-def]
    evidence = Evidence()
    done = replay.replay(replay.proposer_of("shipped", evidence), TABLE, evidence, PROMPT, REPLY,
                         lambda t: False)
    c = done.stats.counters
    assert c.new_tokens == len(REPLY) and c.target_calls == len(done.rounds)
    assert 0 < c.copied_accepted < c.copied_tokens  # copies held, and the edit refused one
    assert c.copied_accepted == sum(min(r.accepted, len(r.proposal)) for r in done.rounds)
    assert done.plain == sum(not r.proposal.tokens for r in done.rounds) > 0  # the reply's first tokens
    assert done.ms == pytest.approx(sum(TABLE.all_rows(len(r.proposal) + 1) for r in done.rounds))


def test_every_variant_is_parameters_and_shipped_is_the_loops_proposer(replay) -> None:  # type: ignore[no-untyped-def]
    from sprinter_edge.decoding.lookup import Lookup
    from sprinter_edge.decoding.splice import Splice
    from sprinter_edge.decoding.staged import Staged

    shipped = replay.proposer_of("shipped", Evidence())
    # the methods own the policy the replay calls shipped
    assert shipped.copy_policy == PromptLookup().copy_policy == Lookup.copy_policy == Staged.copy_policy
    assert Splice.copy_policy == shipped.copy_policy
    assert shipped.evidence.rates == CopyEvidence().rates and shipped.evidence.anchor_slot == ANCHOR
    variants = [(copy_policy, priors) for name, (copy_policy, priors) in replay.VARIANTS.items()
                if name != "shipped"]
    assert (shipped.copy_policy, {}) not in variants  # none is the shipped policy under another name
    for name in replay.VARIANTS:
        evidence = Evidence()
        proposer = replay.proposer_of(name, evidence)
        done = replay.replay(proposer, TABLE, evidence, PROMPT, REPLY, lambda t: False)
        assert done.stats.counters.new_tokens == len(REPLY), name
    wide = replay.proposer_of("min-match-1", Evidence())
    assert wide.index.min_match == 1 and wide.evidence.anchor_slot == 7


def test_split_keeps_one_side(replay) -> None:  # type: ignore[no-untyped-def]
    tuning = FUNCTIONS.select(4, split="tuning")
    report = FUNCTIONS.select(4, split="report")
    assert all(replay.in_split(FUNCTIONS, t.id, "tuning") for t in tuning)
    assert not any(replay.in_split(FUNCTIONS, t.id, "tuning") for t in report)
    assert all(replay.in_split(FUNCTIONS, t.id, None) for t in tuning + report)
    assert replay.parser().parse_args(["tasks", "x.json"]).split == "tuning"


def test_every_flag_has_help(replay) -> None:  # type: ignore[no-untyped-def]
    ap = replay.parser()
    subs = next(a for a in ap._actions if a.choices and "tasks" in a.choices).choices
    for sub in subs.values():
        for action in sub._actions:
            assert action.help, (sub.prog, action.dest)


def test_forced_flags_mark_the_second_and_later_tokens_of_a_run_no_copy_gives(replay) -> None:  # type: ignore[no-untyped-def]
    flags = replay.forced_flags(PROMPT, REPLY, 3)
    # the reply's first 3 tokens follow the prompt's end, a 3-gram never seen: the first is the
    # target's own token, the next two need a step each; so do 8 (after 7, the target's token
    # at the end of the call that refused the copy) and 132-134, which follow 3-grams holding 7 or 8
    assert [i for i, f in enumerate(flags) if f] == [1, 2, 31, 32, 33, 34]
    assert not any(replay.forced_flags([*PROMPT, *PROMPT[:3]], PROMPT[3:], 3))  # all copied


def test_the_replayed_copy_stays_under_its_bounds(replay) -> None:  # type: ignore[no-untyped-def]
    """The copy bound prices the flagged tokens at a target step and every other at the floor's
    row; a perfect draft writes a flagged one for a draft step and a row where that is cheaper.
    The shipped proposer, replayed, reaches neither."""
    from sprinter_edge.bench.costmodel import CostModel

    draft = CostTable(last={1: 2.0, 64: 30.0}, full={1: 2.0, 64: 30.0})
    model = CostModel(TABLE, draft)
    flagged = [(len(PROMPT), replay.forced_flags(PROMPT, REPLY, 3))]
    ar, copy = model.priced(flagged)
    assert ar == pytest.approx(len(REPLY) * 10.0)
    row = 80.0 / 64
    assert copy == pytest.approx(6 * 10.0 + (len(REPLY) - 6) * row)
    _, drafted = model.priced(flagged, draft_writes=True)
    assert drafted == pytest.approx(6 * (2.0 + row) + (len(REPLY) - 6) * row)
    assert model.bound_ratio(flagged) == pytest.approx(ar / copy)
    assert model.floor_ratio([(len(PROMPT), len(REPLY))]) == pytest.approx(10.0 / row)
    evidence = Evidence()
    done = replay.replay(replay.proposer_of("shipped", evidence), TABLE, evidence, PROMPT, REPLY,
                         lambda t: False)
    assert ar / done.ms < ar / drafted <= model.floor_ratio([(len(PROMPT), len(REPLY))])


def test_a_fork_is_the_first_proposed_token_another_continuation_followed(replay) -> None:  # type: ignore[no-untyped-def]
    """The n tokens before a proposed token were followed earlier by another token: the branch
    starts there, at the most recent such continuation; a proposal that only repeats what
    always followed has none. The replay records one target call a round, each priced."""
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 3]
    index = SuffixIndex(min_match=3)  # the proposer's own n-gram index
    index.extend(seq)
    ends = index.where
    assert replay.fork_of(seq, ends, 10, [1, 2, 3, 5], 3) == (3, 3)  # after 1 2 3: 4 at 3, not 5
    assert replay.fork_of(seq, ends, 10, [1, 2, 3, 4], 3) == (3, 8)  # the most recent: 5
    assert replay.fork_of(seq, ends, 5, [1, 2, 3, 4], 3) is None  # before 5, only 4 followed them
    evidence = Evidence()
    done = replay.replay(replay.proposer_of("shipped", evidence), TABLE, evidence, PROMPT, REPLY,
                         lambda t: False)
    assert len(done.calls) == len(done.rounds) and sum(ms for *_, ms in done.calls) == pytest.approx(done.ms)


class FailsOnRound(PromptLookup):
    """A copy proposer with a bug that shows on its `rounds`-th proposal."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds, self.calls = rounds, 0

    def propose(self, ctx, seq):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.rounds:
            raise IndexError("list index out of range")
        return super().propose(ctx, seq)


def test_a_proposer_that_fails_leaves_the_reply_to_the_target(replay, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """A proposer's bug costs speed, not the reply: the loop gives the proposer up, logs why,
    and the target writes the rest of the reply itself (the replay checks every token against
    the recorded reply). Under SPRINTER_EDGE_STRICT=1 (the test suite) it is raised."""
    evidence = Evidence()
    with pytest.raises(IndexError):
        replay.replay(FailsOnRound(3), TABLE, evidence, PROMPT, REPLY, lambda t: False)
    monkeypatch.delenv("SPRINTER_EDGE_STRICT")
    failing = FailsOnRound(3)
    with caplog.at_level("ERROR", logger="sprinter_edge.decoding.loop"):
        done = replay.replay(failing, TABLE, Evidence(), PROMPT, REPLY, lambda t: False)
    assert done.stats.counters.new_tokens == len(REPLY)
    assert failing.calls == 3  # never asked again: the rounds after are the target's own steps
    assert len(done.rounds) == 2  # (fed back: the two before the failure)
    assert done.stats.counters.copied_tokens == sum(len(r.proposal) for r in done.rounds)
    assert any("proposer failed (IndexError: list index out of range)" in m for m in caplog.messages)
