"""The copy's transition table (`Move`, copy_state.py), driven row by row: each row happens in
a replayed token list (no model: a byte tokenizer where the layout needs one, a scripted draft
where the draft reads or writes), and the proposer refuses any move its row does not allow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from support.copying import TABLE

from sprinter_edge.backend.llama import DecodeOutput, common_prefix
from sprinter_edge.costs import Costs, CostTable, Evidence
from sprinter_edge.decoding import DecodeContext, Stats
from sprinter_edge.decoding.proposers.copy_evidence import CopyEvidence
from sprinter_edge.decoding.proposers.copy_state import NO_COPY, RESTING, Move, State
from sprinter_edge.decoding.proposers.prompt_lookup import CopyPolicy, PromptLookup, StagedLookup
from sprinter_edge.decoding.proposers.splice import Splice
from sprinter_edge.decoding.sampling import Sampler, SamplingParams

# every row as dear as a step: no proposal ever pays
LINEAR = CostTable(last={1: 10.0, 64: 640.0}, full={1: 10.0, 64: 640.0})
CHEAP_DRAFT = CostTable(last={1: 0.5, 64: 4.0}, full={1: 0.5, 64: 4.0})
SOURCE = list(range(100, 160))  # 60 distinct tokens
EDITED = [*range(100, 130), 7, 8, *range(132, 160)]  # the source copied, two tokens edited


class Scripted:
    """A stand-in model: its tokens are bytes (what the edit memory, the layout and the line
    rates read of a model), and every logits row picks `text`'s token at that position (the
    draft of a replay, which reads and writes the reply it is given)."""

    def __init__(self, text: Sequence[int] = ()) -> None:
        self.text = list(text)
        self.tokens: list[int] = []
        self.last_decoded = 0

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return bytes([token]) if 0 <= token < 256 else b"\0"

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True) -> list[int]:
        return list(text.encode())

    def is_eog(self, token: int) -> bool:
        return False

    def sync(self, context: list[int], *, n_logits: int = 1, hidden: bool = False,
             on_progress: object = None) -> DecodeOutput:
        keep = min(common_prefix(self.tokens, context), len(context) - n_logits)
        self.tokens, self.last_decoded = list(context), len(context) - keep
        logits = np.zeros((n_logits, 512), np.float32)
        for r in range(n_logits):
            at = len(context) - n_logits + r + 1  # the position row r predicts
            logits[r, self.text[at] if at < len(self.text) else 0] = 1.0
        return DecodeOutput(logits, None)


@dataclass
class Round:
    moves: list[Move]  # the copy's moves, in order
    state: State  # where it stands after the target's verdict


def context(max_new_tokens: int, *, target: Scripted | None = None, draft: Scripted | None = None,
            table: CostTable = TABLE, draft_table: CostTable | None = None) -> DecodeContext:
    return DecodeContext(target=target, draft=draft, sampler=Sampler(SamplingParams()),  # type: ignore[arg-type]
                         stats=Stats(), max_new_tokens=max_new_tokens, costs=Costs(table, draft_table),
                         evidence=Evidence(), kind="edit")


def drive(proposer: PromptLookup | Splice, prompt: list[int], reply: list[int], *,
          max_new_tokens: int | None = None,
          before: Callable[[DecodeContext, PromptLookup], None] | None = None,
          **kwargs: object) -> list[Round]:
    """The copy along `reply` (the target writes it): each round's proposal, the target keeping
    its common prefix with the reply and writing its own next token, and `feedback`. `before`:
    called before each round (a machine whose costs change)."""
    ctx = context(max_new_tokens or len(reply) + 1, **kwargs)  # type: ignore[arg-type]
    copy = proposer.copy if isinstance(proposer, Splice) else proposer
    seq = list(prompt)
    proposer.begin(ctx, seq)
    rounds, pos = [], 0
    while pos < len(reply):
        ctx.produced = pos
        if before is not None:
            before(ctx, copy)
        proposal = proposer.propose(ctx, seq)
        ok = common_prefix(proposal.tokens, reply[pos:pos + len(proposal)])
        proposer.feedback(ctx, proposal, ok)
        rounds.append(Round(list(copy.cursor.moves), copy.cursor.state))
        n = min(ok + 1, len(reply) - pos)
        seq.extend(reply[pos:pos + n])
        pos += n
    return rounds


def text(s: str) -> list[int]:
    return list(s.encode())


# ---------------------------------------------------------------------------- the scenarios

def an_edit() -> list[Round]:
    """The source copied with two tokens replaced: matched, followed, refused at the edit,
    anchored after it."""
    return drive(PromptLookup(), [1, 2, 3, *SOURCE, 4, 5], EDITED)


def to_the_budgets_end() -> list[Round]:
    """A match found on the budget's last token: its copy has nothing left to give."""
    return drive(PromptLookup(), [1, 2, 3, *SOURCE, 4, 5], [60, 61, *SOURCE[:4]], max_new_tokens=6)


def nothing_pays() -> list[Round]:
    """Every row as dear as a step: a copy starts each round and nothing pays for a call."""
    return drive(PromptLookup(), [1, 2, 3, *SOURCE, 4, 5], SOURCE[:20], table=LINEAR)


FENCE, END = 90, 91


def a_stop_token() -> list[Round]:
    """The prompt closes its block with a token the target refused before: a match right before
    it stands there without a proposal, and the target's own token departs from it."""
    evidence = CopyEvidence()
    evidence.refused[FENCE] = 1
    prompt = [1, 2, 3, *SOURCE[:30], FENCE, 4, 5]
    return drive(PromptLookup(evidence), prompt, [60, 61, 62, *SOURCE[27:30], END, 63])


def inside_an_edit() -> list[Round]:
    """A proposal cut before a learned insertion; the target writes its first token, and the
    copy goes on inside it (tests/test_edit_memory.py has the outcome)."""
    source = [10, 11, 12, 13, 40, 20, 21, 22, 23, 24, 25, 26, 27, 28]
    prompt = [1, 2, 3, *source, 4, 5]
    proposer = PromptLookup()
    ctx = context(100)
    proposer.begin(ctx, prompt)
    proposer.memory.learn(40, [], [41, 42, 43, 44])  # a hint of four tokens after 40
    seq, rounds = prompt + [10, 11, 12], []
    ctx.produced = 3
    first = proposer.propose(ctx, seq)
    proposer.feedback(ctx, first, len(first))
    rounds.append(Round(list(proposer.cursor.moves), proposer.cursor.state))
    seq += [*first.tokens, 41]  # the target writes the hint's first token
    ctx.produced = len(seq) - len(prompt)
    proposer.propose(ctx, seq)
    rounds.append(Round(list(proposer.cursor.moves), proposer.cursor.state))
    return rounds


def unread_and_rolled_back() -> list[Round]:
    """A grammar's tokens before the copy refused: its proposal is never read (the round ends
    with no feedback), and the text it stood in is rolled back under it."""
    prompt = [1, 2, 3]
    proposer = PromptLookup()
    ctx = context(200)
    proposer.begin(ctx, prompt)
    seq, rounds = prompt + SOURCE[:30] + SOURCE[:10], []  # the reply repeats itself
    first = proposer.propose(ctx, seq)  # a copy of the reply's own text
    proposer.feedback(ctx, first, len(first))  # held after it
    rounds.append(Round(list(proposer.cursor.moves), proposer.cursor.state))
    seq += [*first.tokens, SOURCE[10 + len(first)]]
    proposer.propose(ctx, seq)  # offered; a grammar's tokens before it refused: no feedback
    rounds.append(Round(list(proposer.cursor.moves), proposer.cursor.state))
    again = proposer.propose(ctx, seq)
    proposer.feedback(ctx, again, len(again))  # held further on in the reply ...
    rounds.append(Round(list(proposer.cursor.moves), proposer.cursor.state))
    proposer.propose(ctx, prompt + SOURCE[:3])  # ... which a grammar's refusal rolls back
    rounds.append(Round(list(proposer.cursor.moves), proposer.cursor.state))
    return rounds


def staged() -> list[Round]:
    """The draft reads each span first (it agrees with the reply)."""
    prompt = [1, 2, 3, *SOURCE, 4, 5]
    return drive(StagedLookup(), prompt, EDITED, draft=Scripted(prompt + EDITED),
                 draft_table=CHEAP_DRAFT)


def splice_writes() -> list[Round]:
    """The draft writes the edit where the copy departs, and the copy goes on after it."""
    prompt = [1, 2, 3, *SOURCE, 4, 5]
    return drive(Splice(), prompt, EDITED, draft=Scripted(prompt + EDITED), draft_table=CHEAP_DRAFT)


CALLS = "f(a,b)\ng(c,d)\nh(e,f)\nk(x,y)\nm(p,q)\nn(r,s)\n"


def a_reformat(policy: CopyPolicy | None = None, evidence: CopyEvidence | None = None,
               reply: str = CALLS.replace(",", ", ")) -> list[Round]:
    """A reply that puts a space after every comma (byte tokens)."""
    proposer = PromptLookup(evidence, copy_policy=policy or CopyPolicy())
    return drive(proposer, text("Reformat:\n" + CALLS), text(reply), target=Scripted())


def a_reformat_then_nothing_pays() -> list[Round]:
    """The same on a machine where, once the reply is laying out anew, no proposal pays."""

    def dearer(ctx: DecodeContext, proposer: PromptLookup) -> None:
        if proposer.layout.active:
            ctx.costs = Costs(LINEAR)

    return drive(PromptLookup(), text("Reformat:\n" + CALLS), text(CALLS.replace(",", ", ")),
                 target=Scripted(), before=dearer)


ASSIGNMENTS = ("    x = h(n,delta)\n    value = f(total,gamma,beta)\n    gamma = f(alpha,beta)\n"
               "    total = call(y,count,beta)\n    total = f(n,x)\n    beta = call(x,count)\n")


def a_reformat_and_a_rename() -> list[Round]:
    """A reformat that also changes a word: the layout finds the source again after it (no
    anchor, and only long matches, so that nothing else finds it first)."""
    reply = ASSIGNMENTS.replace(",", ", ").replace("alpha", "ALPHA")
    proposer = PromptLookup(copy_policy=CopyPolicy(min_match=8, anchor_window=0))
    return drive(proposer, text("Reformat:\n" + ASSIGNMENTS), text(reply), target=Scripted())


def similar_functions() -> list[Round]:
    """A file of similar functions, each with the same lines rewritten (too long a rewrite for
    the edit memory): the reply's own previous function matches where the source does not,
    and gives way to the source where the two meet after the rewrite."""
    rewritten, written, body = list(range(200, 210)), list(range(210, 220)), list(range(220, 235))
    source: list[int] = []
    reply: list[int] = []
    for f in range(3):
        source += [10, 300 + f, *rewritten, *body, 400 + f, 13]
        reply += [10, 300 + f, *written, *body, 400 + f, 13]
    return drive(PromptLookup(), [1, 2, 3, *source, 4, 5], reply)


SCENARIOS: dict[Move, Callable[[], list[Round]]] = {
    Move.UNREAD: unread_and_rolled_back,
    Move.FOLLOW: an_edit,
    Move.RESUME: inside_an_edit,
    Move.DEPART: a_stop_token,
    Move.AT_END: unread_and_rolled_back,
    Move.RELAY: a_reformat,
    Move.REFIND: a_reformat_and_a_rename,
    Move.MATCH: an_edit,
    Move.ANCHOR: an_edit,
    Move.NO_COPY: an_edit,
    Move.EMPTY: to_the_budgets_end,
    Move.STAGED: staged,
    Move.HOMEWARD: similar_functions,
    Move.STOP_FIRST: a_stop_token,
    Move.UNPAID_LAID: a_reformat_then_nothing_pays,
    Move.UNPAID: nothing_pays,
    Move.PROPOSE: an_edit,
    Move.OFFER_AFTER_WRITING: splice_writes,
    Move.LEARN_DEPARTURE: splice_writes,
    Move.ACCEPTED: an_edit,
    Move.REFUSED: an_edit,
    Move.STAGED_READ: staged,
}


@pytest.mark.parametrize("move", list(Move), ids=lambda m: m.name)
def test_every_row_of_the_table_happens_in_a_replayed_reply(move: Move) -> None:
    """The move happens in its scenario (every move on the way is one its row allows: the
    proposer refuses any other), and a round it ends leaves the copy in a state it may reach."""
    rounds = SCENARIOS[move]()
    assert any(move in r.moves for r in rounds), [[m.name for m in r.moves] for r in rounds]
    for r in rounds:
        if r.moves and r.moves[-1] is move:
            assert r.state in move.after, (move.name, r.state)


def test_the_table_has_no_dead_end() -> None:
    """Every state is left by some move and reached by some move; a round starts and ends in a
    state between rounds."""
    for state in State:
        assert any(state in m.before for m in Move), state
        assert any(state in m.after for m in Move), state
    for m in (Move.UNREAD, Move.FOLLOW, Move.MATCH, Move.NO_COPY):
        assert m.before <= {*RESTING, State.HELD, State.OFFERED}


def test_no_copy_and_a_plain_step_are_told_apart() -> None:
    """Where nothing continues the reply the copy answers NO_COPY (splice's draft may write);
    where a copy stands but nothing pays, an empty proposal (a plain step)."""
    prompt = [1, 2, 3, *SOURCE, 4, 5]
    proposer = PromptLookup()
    ctx = context(100)
    proposer.begin(ctx, prompt)
    assert proposer.continue_copy(ctx, prompt + [60]) is NO_COPY
    assert proposer.propose(ctx, prompt + [60, 61]).tokens == []
    ctx = context(100, table=LINEAR)
    proposer.begin(ctx, prompt)
    got = proposer.continue_copy(ctx, prompt + SOURCE[:5])
    assert got is not NO_COPY and got.tokens == [] and proposer.cursor.moves[-1] is Move.UNPAID
