"""The structured-output workload of the bench: tasks with their truth read from the AST, the
reply check, and a short bench run whose constrained replies all follow their schema."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from sprinter_edge.bench import runner, structured
from sprinter_edge.cli import main


def _problem(prompt_id: str) -> dict:
    by_id = {p.id: p for p in structured.structured_prompts()}
    if prompt_id not in by_id:
        pytest.fail(f"{prompt_id} is not a task on this interpreter (its standard library's source "
                    f"changed, or the task builder dropped it)")
    return by_id[prompt_id].problem


def test_the_builder_yields_tasks_whose_truth_is_the_ast() -> None:
    prompts = structured.structured_prompts()
    functions = [p for p in prompts if p.problem["truth"] is not None]
    assert len(functions) >= 40 and len(prompts) - len(functions) == len(structured.SCHEMA_TASKS)
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.workload == "structured" and p.id.startswith("structured/") for p in prompts)
    assert prompts[structured.SCHEMA_EVERY - 1].problem["truth"] is None  # the two sorts mixed
    assert [p.id for p in structured.structured_prompts(7)] == [p.id for p in prompts[:7]]
    for p in functions:  # each truth is valid under the schema, and names the pasted function
        truth = p.problem["truth"]
        assert structured.validate(truth, structured.FUNCTION_SCHEMA) is None
        assert f"def {truth['name']}(" in p.text and 1 <= len(truth["parameters"]) <= 6
    # by hand, from the source: def indent(text, prefix, predicate=None) returns its result
    assert _problem("structured/textwrap.indent")["truth"] == {
        "name": "indent", "returns_value": True, "raises": [],
        "parameters": [{"name": "text", "default": None}, {"name": "prefix", "default": None},
                       {"name": "predicate", "default": "None"}]}
    # statistics.mean raises StatisticsError('mean requires at least one data point')
    mean = _problem("structured/statistics.mean")["truth"]
    assert mean["raises"] == ["StatisticsError"] and mean["returns_value"] is True
    # heapq.heappush(heap, item) pushes and returns nothing
    push = _problem("structured/heapq.heappush")["truth"]
    assert push["returns_value"] is False and [q["name"] for q in push["parameters"]] == ["heap", "item"]


def test_truth_of_a_hand_written_function() -> None:
    source = textwrap.dedent('''
        def f(a, /, b=1, *, c="x", d):
            def inner():
                raise KeyError  # a nested function's raise is not f's
            if a:
                raise errors.Bad("no")
            if b:
                raise ValueError
            return None
    ''')
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert structured.function_truth(fn) == {
        "name": "f", "returns_value": False, "raises": ["ValueError", "errors.Bad"],
        "parameters": [{"name": "a", "default": None}, {"name": "b", "default": "1"},
                       {"name": "c", "default": "'x'"}, {"name": "d", "default": None}]}
    ambiguous = ast.parse("def g(x, *rest):\n    return x\n").body[0]
    assert isinstance(ambiguous, ast.FunctionDef) and structured.function_truth(ambiguous) is None


def test_the_check_of_hand_made_replies() -> None:
    problem = {"schema": structured.FUNCTION_SCHEMA, "truth": {
        "name": "indent", "returns_value": True, "raises": [],
        "parameters": [{"name": "text", "default": None}, {"name": "predicate", "default": "None"}]}}
    right = {"name": "indent", "parameters": [{"name": "text", "default": None},
                                              {"name": "predicate", "default": "None"}],
             "returns_value": True, "raises": []}
    ok = structured.check_reply(problem, "\n" + json.dumps(right, indent=2) + "\n", "stop")
    assert ok.passed and not ok.length and ok.accuracy == 1.0 and ok.why == ""
    wrong = dict(right, name="dedent", raises=["ValueError"])
    half = structured.check_reply(problem, json.dumps(wrong), "stop")
    assert half.passed and half.accuracy == 3 / 5
    assert half.fields == {"name": False, "parameter_names": True, "defaults": True,
                           "returns_value": True, "raises": False}
    # a default written with other quotes is the same expression
    utf8 = {"name": "f", "parameters": [{"name": "e", "default": "'utf-8'"}], "returns_value": True,
            "raises": []}
    assert structured.field_accuracy(dict(utf8, parameters=[{"name": "e", "default": '"utf-8"'}]),
                                     utf8)["defaults"]
    bad = structured.check_reply(problem, '{"name": "indent", "parameters": [', "stop")
    assert not bad.passed and bad.why.startswith("not JSON") and bad.accuracy == 0.0
    extra = structured.check_reply(problem, json.dumps(dict(right, doc="x")), "stop")
    assert not extra.passed and "unexpected doc" in extra.why
    typed = structured.check_reply(problem, json.dumps(dict(right, returns_value=1)), "stop")
    assert not typed.passed and "returns_value" in typed.why
    cut = structured.check_reply(problem, json.dumps(right)[:40], "length")
    assert not cut.passed and cut.length and cut.why.startswith("cut by max_tokens")
    fenced = structured.check_reply(problem, f"Here it is:\n```json\n{json.dumps(right)}\n```\n", "stop")
    assert not fenced.passed and fenced.fenced and fenced.accuracy == 1.0
    # a schema-only task: validity alone
    status = next(p for p in structured.structured_prompts() if p.id == "structured/http-status").problem
    codes = [{"code": c, "name": "x", "category": k} for c, k in
             ((200, "success"), (301, "redirection"), (404, "client error"), (500, "server error"))]
    assert structured.check_reply(status, json.dumps(codes)).passed
    assert structured.check_reply(status, json.dumps(codes)).accuracy is None

    def last(**change: object) -> str:  # why the four codes fail with the last one changed
        return structured.check_reply(status, json.dumps([*codes[:3], dict(codes[3], **change)])).why

    assert "not one of" in last(category="oops") and "> 599" in last(code=700)
    assert "not of type" in last(code=True) and last(code=500.0) == ""
    assert not structured.check_reply(status, json.dumps(codes[:3])).passed
    assert not structured.check_reply(status, "[NaN]").passed


def test_every_schema_compiles_and_takes_its_truth(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """The grammar engine agrees with the validator: each truth, written as JSON, is a complete
    reply under its task's schema."""
    from sprinter_edge.grammar import compile as compile_constraint
    from sprinter_edge.grammar.spec import Constraint

    prompts = structured.structured_prompts()
    for p in prompts:
        matcher = compile_constraint(Constraint.json_schema(p.problem["schema"], strict=True),
                                     fixture_engine.target)
        if p.problem["truth"] is not None:
            matcher.consume_text(json.dumps(p.problem["truth"]))
            assert matcher.accepting(), p.id


def test_free_rows_and_the_reference() -> None:
    specs = runner.expand_methods(["ar+free", "auto"], None)
    assert [(s.label, s.base_method, s.free, s.is_reference) for s in specs] == [
        ("ar", "ar", False, True), ("ar+free", "ar", True, False), ("auto", "auto", False, False)]
    with pytest.raises(ValueError, match="free of the schema"):
        runner.expand_methods(["llama-server+free"], None)


@pytest.mark.slow
def test_a_short_structured_bench(fixture_engine, fixture_target_path: Path,  # type: ignore[no-untyped-def]
                                  fixture_draft_path: Path, tmp_path: Path) -> None:
    """Two tasks, rows ar, ar+free and auto: every constrained reply follows its schema (the
    fixture's 135M model may ramble inside a string up to max_tokens: such a reply is flagged
    `length`, and each of its tokens is one the grammar allowed), and the report shows the
    structured section."""
    from sprinter_edge.grammar import compile as compile_constraint
    from sprinter_edge.grammar.spec import Constraint

    out = tmp_path / "bench"
    rc = main(["bench", "--target", str(fixture_target_path), "--draft", str(fixture_draft_path),
               "--methods", "ar,ar+free,auto", "--humaneval", "0", "--chat", "0", "--explain", "0",
               "--long", "0", "--structured", "2", "--max-tokens", "256", "--threads", "2",
               "--no-peers", "--no-cost-model", "--no-warmup", "--rescore", "none", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    runs = data["runs"]
    assert len(runs) == 6 and all(r["structured"] is not None for r in runs)
    schemas = {p.id: p.problem["schema"] for p in structured.structured_prompts(2)}
    constrained = [r for r in runs if r["method"] != "ar+free"]
    for r in constrained:
        check = r["structured"]
        matcher = compile_constraint(Constraint.json_schema(schemas[r["prompt_id"]]), fixture_engine.target)
        assert matcher.consume(r["tokens"]) == len(r["tokens"]), r["method"]
        assert check["passed"] or (check["length"] and r["stats"]["finish_reason"] == "length"), \
            (r["method"], r["prompt_id"], check["why"], r["text"])
    assert any(r["structured"]["passed"] for r in constrained)
    rows = {r["method"]: r for r in data["rows"]}
    assert rows["ar"]["structured_n"] == 2 and rows["ar"]["ratio_vs_ar"] == 1.0
    assert rows["ar"]["forced_share"] > 0 and rows["ar+free"]["forced_share"] == 0
    assert rows["ar"]["grammar_ms_per_token"] > 0 and rows["ar+free"]["grammar_ms_per_token"] == 0
    md = (out / "bench.md").read_text()
    assert "## structured output" in md and "| valid/tasks |" in md and "| grammar ms/tok |" in md


MAX_SCHEMA_TOKENS = 512  # enough for the fixture's schema-following reply to server-config to end


def test_llama_server_rows_send_the_schema(fixture_engine, fixture_target_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A llama-server row gets the task's schema as /completion's `json_schema`: its reply
    follows it. The budget is one the fixture's reply ends within (`MAX_SCHEMA_TOKENS`), so a
    reply cut by max_tokens fails the test instead of passing it unchecked."""
    from sprinter_edge.backend import llama_tools, native
    from sprinter_edge.bench.llama_server import LlamaServer

    binary = llama_tools.find_tool("llama-server")
    if binary is None:
        pytest.fail(f"llama-server is not built: {llama_tools.BUILD_HINT} (tools/setup.sh --dev runs it)")
    task = next(p for p in structured.structured_prompts() if p.id == "structured/server-config")
    server = LlamaServer("llama-server", binary, fixture_target_path, n_ctx=1024, n_threads=2,
                         no_repack=native.avoid_extra_buffers())
    schema = task.problem["schema"]
    assert server.request_body([1], 4, json_schema=schema)["json_schema"] == schema
    assert "json_schema" not in server.request_body([1], 4)
    try:
        run = server.generate(fixture_engine.encode(task.text), MAX_SCHEMA_TOKENS, json_schema=schema)
    finally:
        server.close()
    check = structured.check_reply(task.problem, run.text, run.finish_reason)
    assert not check.length, f"cut by max_tokens={MAX_SCHEMA_TOKENS}: raise it ({run.text!r})"
    assert check.passed, (check.why, run.text)
