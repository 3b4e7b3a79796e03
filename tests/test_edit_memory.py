"""The copy proposer learns the edit: after the first occurrence of a rename, the later ones
are proposed with the new name (token sequences, no model: the replies are known)."""

from __future__ import annotations

import random

from support.copying import edit_context, replay

from sprinter_edge.costs import Evidence
from sprinter_edge.decoding.lookup import COPIES
from sprinter_edge.decoding.proposers.copy_evidence import CopyEvidence
from sprinter_edge.decoding.proposers.copy_state import Departure, State
from sprinter_edge.decoding.proposers.edit_memory import CODE, COMMENT, EditMemory, _scan
from sprinter_edge.decoding.proposers.prompt_lookup import CopyPolicy, PromptLookup

OLD, NEW = 7, 99


def source_with_uses(uses: int, seed: int = 0) -> list[int]:
    """Code-like tokens: varied lines, the identifier OLD in each."""
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(uses):
        out += [rng.randrange(20, 60) for _ in range(rng.randrange(6, 14))]
        out += [OLD, rng.randrange(60, 80)]
    return out


def test_a_rename_is_learned_at_its_first_occurrence() -> None:
    source = source_with_uses(12)
    prompt = [1, 2, 3, 4] + source + [5, 6]
    reply = [NEW if t == OLD else t for t in source]
    plain = replay(PromptLookup(copy_policy=CopyPolicy(learn_edits=False)), prompt, reply)
    learned = replay(PromptLookup(), prompt, reply)
    assert learned[1] / learned[0] >= 0.95, learned  # nearly every proposed token accepted
    assert learned[2] < plain[2] / 2, (learned, plain)  # and far fewer target calls
    assert learned[1] / learned[0] > plain[1] / plain[0]


def test_a_substitution_the_target_refuses_stops_being_applied() -> None:
    memory = EditMemory()
    memory.learn(30, [OLD], [NEW])
    copy = memory.apply([30, OLD, 31, OLD], 1, 4)
    by = [t.by for t in copy]
    assert [t.token for t in copy] == [NEW, 31, NEW] and by[0] is not None and by[1] is None
    assert memory.substitution(by[0]).value[-1] == NEW and not by[0].prose
    memory.score(by, 0)  # refused where it was applied first
    memory.score([t.by for t in memory.apply([32, OLD], 1, 2)], 0)
    assert [t.token for t in memory.apply([33, OLD], 1, 2)] == [OLD]  # refused more often than accepted: off


def test_an_insertion_after_its_context_token() -> None:
    memory = EditMemory()
    memory.learn(40, [], [41, 42])  # a hint inserted after token 40
    copy = memory.apply([40, 50, 40, 51], 1, 4)
    assert [t.token for t in copy] == [41, 42, 50, 40, 41, 42, 51]
    assert [t.after for t in copy] == [1, 1, 2, 3, 3, 3, 4]  # source positions: the insertion consumes none


def test_a_proposal_cut_inside_an_edit_goes_on_inside_it() -> None:
    """A proposal may end inside a substitution's written tokens (the cost cut is blind to
    them): where the target then writes the edit's next token, the copy goes on with the rest
    of the edit and the source after it, instead of reading a departure from the source."""
    source = [10, 11, 12, 13, 40, 20, 21, 22, 23, 24, 25, 26, 27, 28]
    prompt = [1, 2, 3] + source + [4, 5]
    reply = [10, 11, 12]
    after = {}
    for resume in (True, False):
        proposer = PromptLookup(copy_policy=CopyPolicy(resume_edits=resume))
        ctx = edit_context(8)
        proposer.begin(ctx, prompt)
        proposer.memory.learn(40, [], [41, 42, 43, 44])  # a hint of four tokens after 40
        ctx.produced = len(reply)
        first = proposer.propose(ctx, prompt + reply)
        assert first.tokens == [13, 40]  # cut before the hint (a fresh match is priced short)
        proposer.feedback(ctx, first, len(first))
        seq = prompt + reply + first.tokens + [41]  # the target writes the hint's first token
        ctx.produced, ctx.max_new_tokens = len(seq) - len(prompt), 100
        after[resume] = proposer.propose(ctx, seq).tokens
    assert after[True][:6] == [42, 43, 44, 20, 21, 22]
    assert after[False][:1] != [42]


def test_a_copy_of_the_reply_gives_way_to_the_source_where_they_meet() -> None:
    """In a file of similar functions the reply's previous function, edits made, can match
    longer than the source: copied on, it writes that function's operator. Where two of its
    tokens meet the source just after where the copy left it, the source goes on instead."""
    DEF, X, NL, IND, Q, SAME, END, Y, NL2 = range(10, 19)
    source = [DEF, 101, X, NL, IND, Q, SAME, 201, END, DEF, 102, X, NL, IND, Q, SAME, 202, END]
    prompt = [1, 2, 3] + source + [4, 5]
    seq = prompt + [DEF, 101, Y, NL2, IND, Q, SAME, 201, END, DEF, 102, Y, NL2]
    copies = {}
    for home in (None, 3 + 11):  # where the copy stood in the source: the second function's X
        proposer = PromptLookup()
        ctx = edit_context(100)
        proposer.begin(ctx, prompt)
        proposer.index.extend(seq)
        start = len(prompt) + 4  # the reply's first function, after its NL2
        copied, _ = proposer._copy(seq, start, start + 6)
        assert [t.token for t in copied] == [IND, Q, SAME, 201, END, DEF]
        proposer.cursor.home = home
        copies[home] = [t.token for t in (proposer._homeward(seq, copied) if home is not None else copied)]
    assert copies[None][3] == 201
    assert copies[3 + 11][:5] == [IND, Q, SAME, 202, END]


def test_only_a_copy_of_the_source_teaches_an_edit() -> None:
    """Where the copy was of the reply's own text (the function written before, in a file of
    similar ones) and the reply wrote otherwise, that is this function differing from the one
    before, not an edit: nothing is learned. The same departure from the prompt is a rename."""
    A, B, C, P, Q, R = 30, 31, 32, 40, 41, 42
    prompt = [1, 2, 3, 10, A, 11, B, 12, C, 13, 10, P, 11, Q, 12, R, 13, 4, 5]
    reply = [10, A, 11, B, 12, C, 13, 10, P, 11]
    learned = {}
    for reply_edits in (False, True):
        proposer = PromptLookup(copy_policy=CopyPolicy(reply_edits=reply_edits))
        ctx = edit_context(100)
        proposer.begin(ctx, prompt)
        seq = prompt + reply + [Q, 12]
        proposer.index.extend(seq)
        at, wrote = len(prompt), len(seq) - 2  # the reply's first function, copied for the second:
        # splice's copy offered after written tokens the target kept (`Move.LEARN_DEPARTURE`)
        proposer.cursor.state = State.OFFERED
        proposer.cursor.departure = Departure(at + 3, wrote)  # B there, Q here
        proposer.learn_departure(seq, at + 4, wrote + 1)
        learned[reply_edits] = {sub.key: sub.value for sub in proposer.memory.subs.values()}
        proposer.cursor.departure = Departure(3 + 3, wrote)  # the prompt's B, the reply's Q
        proposer.learn_departure(seq, 3 + 4, wrote + 1)
        assert (B,) in proposer.memory.subs, "a departure from the source is learned"
        assert proposer.memory.subs, "a departure from the source is learned"
    assert learned[False] == {} and learned[True][(B,)] == (Q,)


def test_a_copy_that_holds_is_priced_as_a_long_match() -> None:
    """After a short match (a poor bucket) the copy holds: each round prices it by how long it
    has held, so the proposals grow to full calls within a few rounds."""
    rng = random.Random(5)
    source = [rng.randrange(20, 80) for _ in range(400)]
    prompt = [1, 2, 3] + source + [4, 5]
    proposed, accepted, calls = replay(PromptLookup(), prompt, source)
    assert accepted == proposed
    assert calls <= 16, calls  # 400 tokens: a few short rounds, then 64-row calls (23 without)


def test_a_token_the_target_never_copies_ends_the_copy() -> None:
    """The prompt closes its pasted block with a token the reply never writes (the reply ends
    its own way): once refused, a later copy stops before it instead of proposing past it."""
    FENCE, END = 90, 91

    def wasted(seed: int, evidence: Evidence) -> int:
        rng = random.Random(seed)
        source = [rng.randrange(20, 80) for _ in range(150)]
        prompt = [1, 2, 3] + source + [FENCE] + [rng.randrange(20, 80) for _ in range(60)]
        proposed, accepted, _ = replay(PromptLookup(evidence.of_kind(COPIES, "edit", CopyEvidence)), prompt,
                                       source + [END],
                                       max_new_tokens=1000)
        return proposed - accepted

    learned = Evidence()
    wasted(1, learned)  # one reply that ended at the fence
    assert wasted(2, Evidence()) > 30  # without it, the copy runs past the block
    assert wasted(2, learned) <= 3


# a parameter used in four spellings: after a space, after "(", after "[" and after "."
RESPELL_SOURCE = ("def scale(mode, values):\n    if not mode:\n        return values\n"
                  "    out = [mode * v for v in values]\n    table[mode] = out\n    log(mode)\n"
                  "    return self.mode + len(out) + mode\n")


def test_a_rename_is_respelled_in_every_tokenization(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """A rename learned at one spelling (` mode`) applies at the others (`(mode`, `[mode`,
    `.mode`): the tokens that hold the word elsewhere are retokenized with the new word."""
    model = fixture_engine.target

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, special=False)

    text = tok(RESPELL_SOURCE)
    assert len({model.detokenize([t]) for t in text if "mode" in model.detokenize([t])}) >= 2
    memory = EditMemory(model)
    replaced, written = tok(" mode"), tok(" factor")
    memory.learn(None, replaced, written)
    assert memory.respell(text, replaced, written) >= 1  # other spellings were found
    assert memory.respell(text, replaced, written) == 0  # each rename once
    copy = memory.apply(text, 0, len(text))
    assert model.detokenize([t.token for t in copy]) == RESPELL_SOURCE.replace("mode", "factor")
    # not a rename of one word: nothing respelled
    assert EditMemory(model).respell(text, tok(" mode"), tok(" mode + 1")) == 0
    assert EditMemory(None).respell(text, replaced, written) == 0
    code = tok("if a:\n    x = (if_ok)\n")
    assert EditMemory(model).respell(code, tok(" if"), tok(" while")) == 0  # a keyword: no rename


def test_respelling_raises_acceptance_on_a_rename(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """The copy proposer along a reply that renames `mode` throughout: with the target's
    tokenizer spelling the rename, the second spelling is proposed, not refused."""
    model = fixture_engine.target
    source = model.tokenize(RESPELL_SOURCE, add_special=False, special=False)
    reply = model.tokenize(RESPELL_SOURCE.replace("mode", "factor"), add_special=False, special=False)
    prompt = model.tokenize("Rename mode to factor:\n", add_special=False, special=False) + source
    plain = replay(PromptLookup(), prompt, reply)
    spelled = replay(PromptLookup(), prompt, reply, model=model)
    assert spelled[1] / spelled[0] > plain[1] / plain[0], (spelled, plain)


def test_a_rename_that_writes_on_after_the_word_is_respelled(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """` mode` -> ` mode_value` keeps the old word's token and writes on after it: an insertion
    after its context token. Read with that token it is a rename, respelled like any other."""
    model = fixture_engine.target

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, special=False)

    text = tok(RESPELL_SOURCE)
    (word,), renamed = tok(" mode"), tok(" mode_value")
    assert renamed[0] == word  # the rename keeps the old word's token
    memory = EditMemory(model)
    memory.learn(word, [], renamed[1:])
    assert memory.respell(text, [], renamed[1:]) == 0  # an insertion alone names no word
    assert memory.respell(text, [], renamed[1:], context=word) >= 1
    copy = memory.apply(text, 0, len(text))
    assert model.detokenize([t.token for t in copy]) == RESPELL_SOURCE.replace("mode", "mode_value")


def test_a_renamed_word_is_not_renamed_inside_a_longer_word(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """A substitution learned without context for `p` (a word alone) renames `(p` but not the
    `p` of `se|p`, nor `p` at the start of `p|ath`: it applies where a word starts and ends."""
    model = fixture_engine.target

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, special=False)

    (p,), (text,) = tok("p"), tok("text")
    memory = EditMemory(model)
    memory.learn(None, [p], [text])
    source = [*tok("("), p, *tok(")"), *tok("se"), p, *tok("("), p, *tok("ath")]
    copy = memory.apply(source, 0, len(source))
    assert model.detokenize([t.token for t in copy]) == "(text)sep(path"
    # without the model's tokenizer it cannot tell: every `p` is renamed
    bare = EditMemory()
    bare.learn(None, [p], [text])
    assert model.detokenize([t.token for t in bare.apply(source, 0, len(source))]) == "(text)setext(textath"


def test_the_scanner_tells_code_from_comments_and_strings() -> None:
    assert _scan(CODE, b"x = 1  # a note") == COMMENT
    assert _scan(COMMENT, b" more\n    y") == CODE
    assert _scan(CODE, b"s = '#' + \"a\\\"b\"  ") == CODE  # a `#` or an escaped quote in a string
    assert _scan(CODE, b'    """Return the') == b'"""'
    assert _scan(b'"""', b' path.\n  still "quoted" """') == CODE
    assert _scan(CODE, b"f('open") == b"'"
    assert _scan(b"'", b"\n") == CODE  # a one-line string left open ends with its line


PROSE_SOURCE = ('def base(path):\n    """Return the last part of path."""\n'
                "    # path may end in a slash\n    return split(path)[1]\n")


def test_a_rename_made_in_code_waits_for_the_reply_in_prose(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """A model renames a parameter in code and may keep the word in its docstring and comments:
    a substitution learned in code is proposed in prose only once the reply renamed it there."""
    model = fixture_engine.target

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, special=False)

    text = tok(PROSE_SOURCE)
    memory = EditMemory(model)
    replaced, written = tok(" path"), tok(" text")
    memory.learn(None, replaced, written)
    memory.respell(text, replaced, written)
    copy = memory.apply(text, 0, len(text))
    assert model.detokenize([t.token for t in copy]) == (
        'def base(text):\n    """Return the last part of path."""\n'
        "    # path may end in a slash\n    return split(text)[1]\n")
    assert not any(t.by.prose for t in copy if t.by is not None)  # every substitution made was made in code
    at = next(i for i in range(len(text)) if text[i:i + len(replaced)] == replaced
              and memory.in_prose(text, i))
    memory.learn(None, replaced, written, prose=True)  # the reply renamed it in prose
    copy = memory.apply(text, 0, len(text))
    assert model.detokenize([t.token for t in copy]).count("path") < PROSE_SOURCE.count("path") - 2
    assert any(t.by.prose for t in copy if t.by is not None)
    assert memory.in_prose(text, at) and not memory.in_prose(text, 0)
    # refused in prose: off there, still on in code
    for _ in range(2):
        memory.score([t.by for t in memory.apply(text, at, at + len(replaced))], 0)
    again = model.detokenize([t.token for t in memory.apply(text, 0, len(text))])
    assert "base(text)" in again and "of path" in again
