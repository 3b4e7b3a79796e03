"""The copy proposer follows a reformat byte by byte and lays out what it copies next the way
the reply has (the fixture target's tokenizer; the replies are known)."""

from __future__ import annotations

from support.copying import replay

from sprinter_edge.bench.edits.transforms import poor_layout
from sprinter_edge.decoding.proposers.edit_memory import Applied, EditedToken
from sprinter_edge.decoding.proposers.layout import Layout, Position
from sprinter_edge.decoding.proposers.prompt_lookup import CopiedToken, CopyPolicy, PromptLookup, SuffixIndex

CODE = '''def area(width, height, scale=1):
    total = width * height
    if total > 100:
        for i in range(3):
            total = total - i
    return total * scale


def perimeter(width, height):
    sides = [width, height, width, height]
    return sum(sides) + 0


def ratio(width, height, digits=2):
    value = width / height
    if value > 1:
        value = round(value, digits)
    return value, digits
'''


def tokenizer(fixture_engine):  # type: ignore[no-untyped-def]
    model = fixture_engine.target
    return model, lambda text: model.tokenize(text, add_special=False, special=False)


def laid_out(layout: Layout, model, tok, committed: str, text: str) -> str:  # type: ignore[no-untyped-def]
    """`text` copied after `committed` (its tokens indexed after the committed ones)."""
    before, tokens = tok(committed), tok(text)
    source = before + tokens
    start = len(before)
    copy = [EditedToken(t, start + 1 + i) for i, t in enumerate(tokens)]
    done = layout.apply(before, source, Position(start), copy)
    return text if done is None else model.detokenize([t.token for t in done.tokens])


def learn(layout: Layout, tok, source: str, reply: str, before: str = "x = ") -> int:  # type: ignore[no-untyped-def]
    """The reply wrote `reply` where the source has `source`, both after `before`."""
    context, old, new = tok(before), tok(source), tok(reply)
    text = context + old
    return layout.learn(text, Position(len(context)), Position(len(text)), context, new)


def test_where_the_reply_stands_in_its_source_read_without_blanks(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    model, tok = tokenizer(fixture_engine)
    layout = Layout(model)
    source = tok("f(a,b)+g(c)")
    reply = tok("f(a, b")
    at = layout.project(source + reply, Position(0), reply)
    assert at is not None
    # the source's bytes up to there are the reply's without its blanks
    written = b"".join(model.token_bytes(t) for t in source[:at.at])
    written += model.token_bytes(source[at.at])[:at.skip]
    assert written == b"f(a,b"
    assert layout.project(source + tok("f(x"), Position(0), tok("f(x")) is None  # an edit, not a layout


def test_a_space_after_a_comma_is_learned_and_applied(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    model, tok = tokenizer(fixture_engine)
    layout = Layout(model)
    assert laid_out(layout, model, tok, "x = ", "f(x,y,z)") == "f(x,y,z)"  # nothing learned yet
    assert learn(layout, tok, "g(a,b)", "g(a, b)") == 1
    assert laid_out(layout, model, tok, "x = ", "f(x,y,z)") == "f(x, y, z)"
    assert laid_out(layout, model, tok, "g(a,", "b)") == " b)"  # the gap before the copy too
    assert laid_out(layout, model, tok, "g(a", "+b)") == "+b)"  # other characters: no rule


def test_an_indentation_teaches_its_scale(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    model, tok = tokenizer(fixture_engine)
    layout = Layout(model)
    assert learn(layout, tok, "if a:\n  b", "if a:\n    b", before="pass\n") == 1
    assert laid_out(layout, model, tok, "pass", "\n  a\n    b\nc") == "\n    a\n        b\nc"


def test_a_change_of_text_teaches_no_layout(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    model, tok = tokenizer(fixture_engine)
    layout = Layout(model)
    assert learn(layout, tok, "g(a,lo)", "g(a, low)") == 0
    assert learn(Layout(None), tok, "g(a,b)", "g(a, b)") == 0
    assert laid_out(layout, model, tok, "x = ", "f(x,y)") == "f(x,y)"


def test_a_refused_rule_is_dropped(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    model, tok = tokenizer(fixture_engine)
    layout = Layout(model)
    learn(layout, tok, "g(a,b)", "g(a, b)")
    before, tokens = tok("x = "), tok("f(x,y)")
    source = before + tokens
    copy = [EditedToken(t, len(before) + 1 + i) for i, t in enumerate(tokens)]
    done = layout.apply(before, source, Position(len(before)), copy)
    assert done is not None
    rules = [t.rule for t in done.tokens]
    first = next(i for i, r in enumerate(rules) if r is not None)
    layout.score(rules, first)  # the target refused the token the rule laid out
    layout.score(rules, first)
    assert laid_out(layout, model, tok, "x = ", "f(x,y)") == "f(x,y)"


def test_a_reformat_is_copied_laid_out(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """Along a reply that reformats a poorly laid out file, the copy that follows the source
    without its blanks and lays it out by the learned rules needs fewer target calls than the
    copy that matches tokens."""
    model, tok = tokenizer(fixture_engine)
    source = poor_layout(CODE)
    assert source != CODE
    prompt = tok("Reformat this file to PEP 8:\n") + tok(source)
    reply = tok(CODE)
    plain = replay(PromptLookup(copy_policy=CopyPolicy(layout=False)), prompt, reply, model=model)
    laid = replay(PromptLookup(), prompt, reply, model=model)
    assert laid[2] < plain[2], (laid, plain)


def test_a_way_home_the_layout_cannot_copy_keeps_the_proposal_as_it_was() -> None:
    """The copy of the reply's own text goes home to the source where two of its tokens meet
    it; where the source's copy from there is laid out up to a gap it cannot tell (nothing), the
    reply's copy stands, with the source positions and edits it had, one per token."""
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    lookup = PromptLookup()
    lookup.index = SuffixIndex(prompt=prompt)
    lookup.cursor.home = 2
    # copied from the reply; 11, 12 meet the source at position 2
    copied = [CopiedToken(12, Position(30)), CopiedToken(13, Position(31), by=Applied((5,), False)),
              CopiedToken(40, Position(32), laid=2), CopiedToken(41, Position(33))]

    def laid_out_to_nothing(seq, start, stop, skip=0, drop=0):  # type: ignore[no-untyped-def]
        return [], []  # (an alignment: not None)

    lookup._copy = laid_out_to_nothing  # type: ignore[method-assign]
    assert lookup._homeward([*prompt, 9, 11], copied) == copied


def test_a_copy_laid_out_up_to_a_gap_keeps_one_position_and_edit_per_token() -> None:
    """Where the layout lays a copy out only up to a kind of gap the reply has not shown, the
    copy ends there, and so do the source positions, edits and rules kept for its tokens: the
    token after the copy is read as no substitution's (it was indexed past the copy's end)."""
    from sprinter_edge.decoding.proposers.layout import Laid, LaidToken

    prompt = [10, 11, 12, 13, 14, 15, 16, 17]

    class ToAGap:  # lays the copy out as it is, but knows nothing past its second token
        active = True

        def apply(self, committed, source, start, copy):  # type: ignore[no-untyped-def]
            by = Applied((3,), False)
            return Laid([LaidToken(t.token, Position(t.after), by, None, []) for t in copy], unknown=2)

    lookup = PromptLookup()
    lookup.index = SuffixIndex()
    lookup.index.extend(prompt)
    lookup.layout = ToAGap()  # type: ignore[assignment]
    copied, aligned = lookup._copy(prompt, 2, 7)
    assert [t.token for t in copied] == [12, 13] and aligned == [True, True]
    assert lookup._resume_at(copied, 2, drop=0) is None
