"""The grammar layer (sprinter_edge/grammar): constraints -> token masks with llguidance, on the
real SmolLM2 test model's vocabulary and (integration) the default pair's Qwen vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sprinter_edge.backend.llama import LlamaModel, LoadOptions
from sprinter_edge.errors import GrammarError, SettingsError
from sprinter_edge.grammar import Constraint, Matcher, apply_mask, compile, tokenizer_for
from sprinter_edge.serving.tools import call_text, forced_prefix, parse_reply

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
PERSON_TEXT = '{"name": "Ann", "age": 31}'
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                       "required": ["x", "y"]}}},
]


@pytest.fixture(scope="module")
def smol(fixture_target_path: Path):
    model = LlamaModel(fixture_target_path, LoadOptions(n_ctx=128, n_threads=1))
    yield model
    model.close()


@pytest.fixture(scope="module")
def qwen(default_pair_paths: tuple[Path, Path]):
    """The default pair's draft (Qwen2.5-Coder's 151k vocabulary): its tests are `integration`."""
    model = LlamaModel(default_pair_paths[0], LoadOptions(n_ctx=128, n_threads=1))
    yield model
    model.close()


def toks(model: LlamaModel, text: str) -> list[int]:
    return model.tokenize(text, add_special=False)


def allowed_bytes(model: LlamaModel, m: Matcher) -> set[bytes]:
    return {model.token_bytes(int(t), special=True) for t in np.flatnonzero(m.mask())}


def walk(m: Matcher, tokens: list[int]) -> None:
    """Consume one token at a time, checking at every state that the end-of-generation tokens
    are allowed exactly when the grammar accepts, and that the mask and `allowed` agree."""
    for t in tokens:
        eos = m.tokenizer.eos_ids
        assert all(m.allowed(e) == m.accepting() for e in eos), m.position
        assert m.allowed(t), m.position
        assert m.consume([t]) == 1


# ------------------------------------------------------------------ constraints (no model)


def test_response_format() -> None:
    assert Constraint.from_response_format({"type": "text"}) is None
    assert Constraint.from_response_format(None) is None
    assert Constraint.from_response_format({"type": "json_object"}).type == "json_object"
    c = Constraint.from_response_format(
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert (c.type, c.name, c.strict, c.schema) == ("json_schema", "person", True, PERSON)
    assert list(c.schema["properties"]) == ["name", "age"]  # key order kept: it is the output's
    assert c == Constraint.json_schema(PERSON, name="person") and hash(c) == hash(Constraint.json_schema(
        json.dumps(PERSON), name="person"))
    # llama.cpp server's spelling of a schema
    assert Constraint.from_response_format({"type": "json_object", "schema": PERSON}).type == "json_schema"
    with pytest.raises(GrammarError, match="json_schema"):
        Constraint.from_response_format({"type": "json_schema"})
    with pytest.raises(GrammarError, match="unsupported response_format type 'xml'"):
        Constraint.from_response_format({"type": "xml"})


@pytest.mark.parametrize(("make", "reason"), [
    (lambda: Constraint.json_schema({"type": "strin"}), "Invalid type: strin"),
    (lambda: Constraint.json_schema("{not json"), "not JSON"),
    (lambda: Constraint.json_schema({"type": "object", "dependentSchemas": {"a": {}}}), "dependentSchemas"),
    (lambda: Constraint.json_schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (lambda: Constraint.json_schema({"type": "string", "pattern": "(?=a)b"}), "look-around"),
    (lambda: Constraint.regex("[a-z"), "unclosed character class"),
    (lambda: Constraint.grammar('root ::= "a" ('), "GBNF"),
    (lambda: Constraint.grammar('root ::= "yes" | nope'), "nope"),
    (lambda: Constraint.grammar("start: foo"), "unknown name"),
    (lambda: Constraint.grammar("hello"), "cannot tell the grammar's syntax"),
])
def test_invalid_constraints_raise_one_line_grammar_errors(make, reason: str) -> None:
    with pytest.raises(GrammarError, match=reason) as info:
        make()
    assert isinstance(info.value, SettingsError) and info.value.exit_code == 2
    assert "\n" not in str(info.value)


def test_not_strict_ignores_what_llguidance_lacks() -> None:
    Constraint.json_schema({"type": "object", "dependentSchemas": {"a": {}}}, strict=False)
    c = Constraint.from_response_format({"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "format": "no-such-format"}}})  # strict unset
    assert not c.strict


def test_grammar_syntax_detection() -> None:
    assert Constraint.grammar('root ::= "yes" | "no"').type == "gbnf"
    assert Constraint.grammar('start: "yes" | "no"').type == "lark"
    assert Constraint.grammar('root ::= "yes"', syntax="gbnf").type == "gbnf"
    # a GBNF rule named `start` is not Lark's start rule (llguidance's converter renames root
    # to start, so it refuses the grammar, as GBNF)
    with pytest.raises(GrammarError, match="invalid GBNF grammar: Rule 'start' already exists"):
        Constraint.grammar('root ::= start\nstart ::= "x"')


def test_tool_choice_shapes() -> None:
    assert Constraint.from_tool_choice(TOOLS[1:], "auto") is None  # no strict tool: free text
    assert Constraint.from_tool_choice(TOOLS[1:], None) is None
    auto = Constraint.from_tool_choice(TOOLS, "auto")  # a strict tool: calls or free text
    assert auto is not None and auto == Constraint.from_tool_choice(TOOLS, None)
    assert "lead" in auto.source and '"const": "add"' in auto.source
    assert Constraint.from_tool_choice(TOOLS, "none") is None
    assert Constraint.from_tool_choice(None, None) is None
    named = Constraint.from_tool_choice(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert named.type == "lark" and '"const": "add"' in named.source and "get_weather" not in named.source
    required = Constraint.from_tool_choice(TOOLS, "required")
    assert "get_weather" in required.source and "add" in required.source
    with pytest.raises(GrammarError, match="'nope', which is not one of the tools"):
        Constraint.from_tool_choice(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(GrammarError, match="no tools"):
        Constraint.from_tool_choice([], "required")
    bad = {"type": "object", "properties": {"a": {"type": "strin"}}}
    with pytest.raises(GrammarError, match="strin"):  # a strict tool's schema must compile
        Constraint.from_tool_choice([{"function": {"name": "f", "parameters": bad, "strict": True}}],
                                    "required")
    # a non-strict one that does not is a call with any object as its arguments (as before)
    assert Constraint.from_tool_choice([{"function": {"name": "f", "parameters": bad}}], "required")


# ------------------------------------------------------------------ matchers (SmolLM2's vocab)


def test_tokenizer_is_cached_and_sized_to_the_model(smol: LlamaModel) -> None:
    tok = tokenizer_for(smol)
    assert tokenizer_for(smol) is tok
    assert tok.n_vocab == smol.n_vocab
    assert set(tok.eos_ids) == {t for t in range(smol.n_vocab) if smol.is_eog(t)}
    assert smol.eos_id in tok.eos_ids


def test_json_schema_mask_allows_a_brace_first_and_nothing_else(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    mask = m.mask()
    assert mask.dtype == np.bool_ and mask.shape == (smol.n_vocab,)
    assert m.allowed(toks(smol, "{")[0])
    assert all(b.startswith(b"{") for b in allowed_bytes(smol, m))
    assert not any(m.allowed(e) for e in m.tokenizer.eos_ids)
    assert not m.accepting() and not m.done() and m.position == 0


def test_a_valid_json_text_walks_to_the_end(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    tokens = toks(smol, PERSON_TEXT)
    walk(m, tokens)
    assert m.position == len(tokens)
    assert m.accepting() and m.done()
    assert set(np.flatnonzero(m.mask())) == set(m.tokenizer.eos_ids)  # only the end remains
    # the end-of-generation token is taken, and counts as a position
    assert m.consume([smol.eos_id]) == 1 and m.position == len(tokens) + 1
    assert m.consume(toks(smol, " ")) == 0


def test_a_wrong_token_is_rejected_and_changes_nothing(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    tokens = toks(smol, PERSON_TEXT)
    assert m.consume(tokens[:1]) == 1
    before = m.mask().copy()
    wrong = toks(smol, "age")[0]  # the schema's first key is "name"
    assert not m.allowed(wrong)
    assert m.consume([wrong]) == 0
    assert m.position == 1 and m.error is None
    assert np.array_equal(m.mask(), before)
    # accepted in order up to the first rejected token; the state is after the accepted ones
    assert m.consume(tokens[1:3] + [wrong] + tokens[3:]) == 2
    assert m.position == 3
    assert m.consume(tokens[3:]) == len(tokens) - 3 and m.done()


def test_rollback_restores_earlier_states(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    tokens = toks(smol, PERSON_TEXT)
    masks = []
    for t in tokens:
        masks.append(m.mask().copy())
        m.consume([t])
    masks.append(m.mask().copy())
    m.consume([smol.eos_id])
    for back in (1, 3, len(tokens) + 1):  # across the end and the EOS, and to the start
        m.rollback(back)
        at = m.position
        assert np.array_equal(m.mask(), masks[at])
        assert m.consume(tokens[at:]) == len(tokens) - at
        m.consume([smol.eos_id])
    with pytest.raises(ValueError):
        m.rollback(m.position + 1)
    m.reset()
    assert m.position == 0 and np.array_equal(m.mask(), masks[0])


def test_validate_and_copy_leave_the_state_alone(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    tokens = toks(smol, PERSON_TEXT)
    m.consume(tokens[:2])
    assert m.validate(tokens[2:]) == len(tokens) - 2 and m.position == 2
    fork = m.copy()
    assert fork.consume(tokens[2:]) == len(tokens) - 2 and fork.done()
    assert m.position == 2 and not m.done()
    assert m.consume(tokens[2:4]) == 2 and fork.position == len(tokens)


def test_masks_along_a_draft(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    tokens = toks(smol, PERSON_TEXT)
    m.consume(tokens[:2])
    draft = tokens[2:6]
    rows = m.masks_along(draft + toks(smol, "x") + tokens[6:8])  # the 5th is rejected
    assert rows.shape == (8, smol.n_vocab) and m.position == 2
    fork = m.copy()
    for i in range(5):
        assert np.array_equal(rows[i], fork.mask())
        if i < 4:
            fork.consume([draft[i]])
    assert not rows[5:].any()


def test_forced_and_fast_forward_tokens(smol: LlamaModel) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    m = compile(Constraint.json_schema(schema), smol)
    assert m.forced() is None and m.ff_tokens() == []  # `{` or `{"`: a choice
    key = toks(smol, "name")
    assert len(key) == 1
    assert m.consume(toks(smol, '{"')) == 1
    assert m.forced() == key[0] and m.mask().sum() == 1  # the one key: one token
    assert m.ff_tokens() == key
    # a closing brace after the last value is the only token left
    m = compile(Constraint.json_schema({"type": "object", "properties": {"a": {"const": 1}},
                                        "required": ["a"], "additionalProperties": False,
                                        "x-guidance": {"whitespace_flexible": False}}), smol)
    assert m.consume(toks(smol, '{"a":1')) == len(toks(smol, '{"a":1'))
    assert m.forced() == toks(smol, "}")[0]


def test_end_of_generation_only_where_the_grammar_accepts(smol: LlamaModel) -> None:
    m = compile(Constraint.regex(r"[0-9]{2,3}"), smol)
    digits = [toks(smol, d)[0] for d in "123"]
    assert [smol.token_bytes(t) for t in digits] == [b"1", b"2", b"3"]
    states = []
    for t in digits:
        m.consume([t])
        states.append((m.accepting(), m.done(), all(m.allowed(e) for e in m.tokenizer.eos_ids)))
    assert states == [(False, False, False), (True, False, True), (True, True, True)]


@pytest.mark.parametrize("constraint", [
    Constraint.regex(r"(yes|no)\."),
    Constraint.grammar('root ::= ("yes" | "no") "."'),
    Constraint.grammar('start: ("yes" | "no") "."'),
    Constraint.grammar('start: answer "."\nanswer: "yes" | "no"', syntax="lark"),
])
def test_regex_gbnf_and_lark_compile_and_constrain(smol: LlamaModel, constraint: Constraint) -> None:
    m = compile(constraint, smol)
    assert allowed_bytes(smol, m) <= {b"y", b"ye", b"yes", b"n", b"no", b"yes.", b"no."}
    assert not m.allowed(toks(smol, "maybe")[0])
    walk(m, toks(smol, "yes."))
    assert m.done()


def test_lark_special_tokens_resolve_against_the_vocabulary(smol: LlamaModel) -> None:
    im_end = smol.tokenize("<|im_end|>", add_special=False, special=True)
    assert len(im_end) == 1
    m = compile(Constraint.grammar('start: "hi" <|im_end|>'), smol)
    assert m.consume(toks(smol, "hi")) == 1 and m.forced() == im_end[0]
    # the text `<|im_end|>` is not the special token
    assert compile(Constraint.grammar('start: "hi" <|im_end|>'), smol).consume(
        toks(smol, "hi<|im_end|>")) < len(toks(smol, "hi<|im_end|>"))
    with pytest.raises(GrammarError, match="bogus"):
        compile(Constraint.grammar("start: <|bogus|>"), smol)


def test_forced_tool_call_is_the_text_tools_py_parses(smol: LlamaModel) -> None:
    c = Constraint.from_tool_choice(TOOLS, {"type": "function", "function": {"name": "add"}})
    m = compile(c, smol)
    # everything up to the first argument's value is forced: the fast-forward tokens hold it
    # (less a last token that a longer one could span past)
    forced = b"".join(smol.token_bytes(t) for t in m.ff_tokens())
    prefix = forced_prefix("add").encode()
    assert (prefix + b'{"x": ').startswith(forced) and len(forced) >= len(prefix)
    text = call_text("add", {"x": 1, "y": 2.5})
    walk(m, toks(smol, text))
    assert m.done()
    assert parse_reply(text, forced=["add"]).calls[0].arguments == '{"x": 1, "y": 2.5}'
    # another tool, other separators, a second call: rejected
    for bad in (call_text("get_weather", {"city": "Paris"}), text.replace('": ', '":'),
                text + "\n" + text):
        m = compile(c, smol)
        assert m.consume(toks(smol, bad)) < len(toks(smol, bad))


def test_required_tool_calls_one_or_more_of_any_tool(smol: LlamaModel) -> None:
    c = Constraint.from_tool_choice(TOOLS, "required")
    text = call_text("get_weather", {"city": "Paris"}) + "\n" + call_text("add", {"x": 1, "y": 2})
    m = compile(c, smol)
    walk(m, toks(smol, text))
    assert m.accepting()
    assert [call.name for call in parse_reply(text, forced=["get_weather", "add"]).calls] == [
        "get_weather", "add"]
    bad = call_text("get_weather", {"town": "Paris"})  # strict: no other keys
    assert compile(c, smol).consume(toks(smol, bad)) < len(toks(smol, bad))
    one = Constraint.from_tool_choice(TOOLS, "required", parallel=False)
    m = compile(one, smol)
    assert m.consume(toks(smol, text)) < len(toks(smol, text))


def test_auto_tool_choice_is_free_text_or_shaped_calls(smol: LlamaModel) -> None:
    c = Constraint.from_tool_choice(TOOLS, "auto")
    weather = call_text("get_weather", {"city": "Paris"})
    bare = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```'
    for text, calls in (("It is sunny in Paris today.", 0), ('{"a": 1}', 0), (weather, 1),
                        ("Checking.\n" + weather, 1), (bare, 1), (bare[8:-4], 1),
                        (weather + "\n" + call_text("add", {"x": 1, "y": 2, "z": 3}), 2)):
        m = compile(c, smol)
        walk(m, toks(smol, text))
        assert m.accepting(), text
        parsed = parse_reply(text, names=["get_weather", "add"])
        assert len(parsed.calls) == calls, text
    # a strict tool's arguments follow its schema, tagged or bare; no call hides in the free
    # text; the calls end the reply
    for bad in (call_text("get_weather", {"town": "Paris"}), f"see {weather[:11]} here",
                '{"name": "get_weather", "arguments": {}}', '```json\n{"name": "nope", ',
                weather + "\nDone.", bare + "\nDone."):
        m = compile(c, smol)
        tokens = toks(smol, bad)
        assert m.consume(tokens) < len(tokens), bad
    one = Constraint.from_tool_choice(TOOLS, "auto", parallel=False)
    text = weather + "\n" + weather
    assert compile(one, smol).consume(toks(smol, text)) < len(toks(smol, text))


def test_a_forced_prefix_already_in_the_reply_is_consumed_as_text(smol: LlamaModel) -> None:
    c = Constraint.from_tool_choice(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    m = compile(c, smol)
    m.consume_text(forced_prefix("get_weather"))
    walk(m, toks(smol, '{"city": "Oslo"}}\n</tool_call>'))
    assert m.done()
    m = compile(c, smol)
    with pytest.raises(GrammarError, match="does not fit"):
        m.consume_text(forced_prefix("add"))
    assert m.position == 0


def test_apply_mask(smol: LlamaModel) -> None:
    m = compile(Constraint.json_schema(PERSON), smol)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=smol.n_vocab).astype(np.float32)
    kept = logits[m.mask()].copy()
    out = apply_mask(logits, m.mask())
    assert out is logits
    assert np.array_equal(logits[m.mask()], kept) and np.all(np.isneginf(logits[~m.mask()]))
    assert m.allowed(int(np.argmax(logits)))
    rows = rng.normal(size=(3, smol.n_vocab)).astype(np.float32)
    apply_mask(rows, m.mask())
    assert np.isneginf(rows[:, ~m.mask()]).all()
    with pytest.raises(TypeError):
        apply_mask(logits.astype(np.float64), m.mask())
    with pytest.raises(ValueError):
        apply_mask(logits[:-1], m.mask())


# ------------------------------------------------------------------ Qwen2.5's vocabulary


@pytest.mark.integration
def test_qwen_end_tokens_and_tool_call_token(qwen: LlamaModel) -> None:
    tok = tokenizer_for(qwen)
    assert tok.n_vocab == qwen.n_vocab
    ends = {qwen.tokenize(s, add_special=False, special=True)[0] for s in ("<|im_end|>", "<|endoftext|>")}
    assert ends <= set(tok.eos_ids)
    m = compile(Constraint.json_schema(PERSON), qwen)
    walk(m, toks(qwen, PERSON_TEXT))
    assert m.done() and set(np.flatnonzero(m.mask())) == set(tok.eos_ids)
    # `<tool_call>` is one token in Qwen's vocabulary: the grammar's text allows it
    c = Constraint.from_tool_choice(TOOLS, "required")
    text = call_text("get_weather", {"city": "Paris"})
    tokens = toks(qwen, text)
    assert qwen.token_bytes(tokens[0]) == b"<tool_call>"
    m = compile(c, qwen)
    walk(m, tokens)
    assert m.accepting()
    assert any(m.allowed(t) for t in ends)
    # under "auto" the free text cannot hold that token: only the call path may take it
    auto = compile(Constraint.from_tool_choice(TOOLS, "auto"), qwen)
    walk(auto, toks(qwen, "Sure.\n") + tokens)
    assert auto.accepting()
    auto = compile(Constraint.from_tool_choice(TOOLS, "auto"), qwen)
    walk(auto, toks(qwen, "Sure."))
    assert auto.consume([tokens[0], *toks(qwen, "hi")]) == 1  # the token opens a call...
    assert not auto.accepting()  # ...that must follow


@pytest.mark.integration
def test_qwen_mask_at_every_step_of_a_json_reply(qwen: LlamaModel) -> None:
    """mask() at each decoding step on the 151k vocabulary, over a JSON reply's states: it
    allows the reply's next token, and the reply ends where the schema does. What it costs per
    token is the bench's "grammar ms/tok" (`bench --structured`, on the default pair), not a
    bound on a shared CPU here."""
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "number"}}, "ok": {"type": "boolean"}},
        "required": ["name", "tags", "scores", "ok"]}
    text = json.dumps({"name": "A fairly long name, with words", "tags": ["alpha", "beta", "gamma"],
                       "scores": [1.5, -2, 30.25], "ok": True}, indent=2)
    m = compile(Constraint.json_schema(schema), qwen)
    for t in toks(qwen, text):
        mask = m.mask()
        assert mask.shape == (qwen.n_vocab,) and mask[t] and not mask.all()
        assert m.consume([t]) == 1
    assert m.done()
