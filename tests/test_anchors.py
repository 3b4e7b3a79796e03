"""The anchors a user would pick instead, on the fixture pair: llama.cpp's own llama-server
(a real server process: tools/build_llama_server.sh builds it, tools/setup.sh --dev runs that),
llama-cpp-python's prompt lookup, the long-context prompts, the per-workload groups, and the
flat-batch bound doctor prints."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sprinter_edge import SamplingParams
from sprinter_edge.backend import llama_tools, native
from sprinter_edge.bench import peers, plot, prompts, report, runner, summary
from sprinter_edge.bench.llama_server import SERVER_METHODS, LlamaServer, server_stats
from sprinter_edge.costs.table import CostTable, dips
from sprinter_edge.planning.planner import Planner, flat_bound

PROMPT = "Write a Python function that reverses a string, with a docstring."


@pytest.fixture(scope="module")
def server_binary() -> Path:
    binary = llama_tools.find_tool("llama-server")
    if binary is None:
        pytest.fail(f"llama-server is not built for this llama-cpp-python and its CMAKE_ARGS: "
                    f"{llama_tools.BUILD_HINT} (tools/setup.sh --dev runs it)")
    return binary


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("name", ["llama-server", "llama-server-ngram-simple"])
def test_llama_server_matches_ar_and_stops(name: str, server_binary: Path, fixture_engine,  # type: ignore[no-untyped-def]
                                           fixture_target_path: Path) -> None:
    """Greedy, 16 tokens, the same token ids as the engine's prompt: the same text as `ar`.
    (The server reads the prompt in one batch where the engine decodes its last token alone,
    and ngram-simple verifies its proposals in batches: llama.cpp's CPU kernels are not
    batch-invariant with weight repacking on, so a near-tie could flip on another prompt or
    model; on this one the texts agree.)"""
    prompt = fixture_engine.encode(PROMPT)
    ref = fixture_engine.generate(prompt, SamplingParams(max_tokens=16), method="ar")
    server = LlamaServer(name, server_binary, fixture_target_path, n_ctx=1024, n_threads=1,
                         no_repack=native.avoid_extra_buffers())
    try:
        server.start()
        proc, port = server.proc, server.port
        assert proc is not None and proc.poll() is None and _port_open(port)
        run = server.generate(prompt, 16)
        again = server.generate(prompt, 16)  # cache_prompt off: the prompt is read anew each call
    finally:
        server.close()
    assert proc.poll() is not None and server.proc is None  # the process is gone
    assert not _port_open(port)
    assert run.text == ref.text and run.tokens == ref.token_ids
    assert again.text == run.text
    t = run.timings
    assert t["prompt_n"] == len(prompt) == again.timings["prompt_n"]
    assert t["predicted_n"] == 16 and run.finish_reason == "length"
    assert run.tokens_per_second == pytest.approx(t["predicted_per_second"]) and run.tokens_per_second > 0
    assert run.timed_tokens == 15 and run.decode_seconds == pytest.approx(t["predicted_ms"] / 1e3)
    stats = server_stats(name, run)
    assert 0 <= stats["draft_n_accepted"] <= stats["draft_n"]
    assert stats["target_calls"] == 15 - stats["draft_n_accepted"]
    if name == "llama-server":
        assert stats["draft_n"] == 0 and "draft_n" not in t  # the plain server drafts nothing


def test_llama_server_stop_text_keeps_the_tokens_before_it(server_binary: Path, fixture_engine,  # type: ignore[no-untyped-def]
                                                          fixture_target_path: Path) -> None:
    prompt = fixture_engine.encode(PROMPT)
    full = fixture_engine.generate(prompt, SamplingParams(max_tokens=24), method="ar").text
    words = full.split()
    assert len(words) >= 4, full
    stop = words[3]
    ref = fixture_engine.generate(prompt, SamplingParams(max_tokens=24, stop=(stop,)), method="ar")
    with LlamaServer("llama-server", server_binary, fixture_target_path, n_ctx=1024, n_threads=1,
                     no_repack=native.avoid_extra_buffers()) as server:
        run = server.generate(prompt, 24, stop=(stop,))
    assert run.finish_reason == "stop" and run.timings["stop_type"] == "word"
    assert run.text == ref.text and run.tokens == ref.token_ids


def test_llama_server_bad_binary_is_one_clear_error(tmp_path: Path, fixture_target_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: unknown argument' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = LlamaServer("llama-server", fake, fixture_target_path, startup_timeout=20)
    with pytest.raises(Exception, match="exited with status 3.*unknown argument"):
        server.start()
    assert server.proc is None
    monkeypatch.setenv(llama_tools.SERVER_ENV, str(tmp_path / "missing"))
    with pytest.raises(llama_tools.ToolsError, match="not an executable file"):
        llama_tools.find_tool()
    with pytest.raises(ValueError, match="unknown llama-server configuration"):
        LlamaServer("llama-server-eagle", fake, fixture_target_path)


def test_missing_server_build_is_one_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          fixture_engine) -> None:  # type: ignore[no-untyped-def]
    from sprinter_edge.bench import results

    monkeypatch.delenv(llama_tools.SERVER_ENV, raising=False)
    monkeypatch.setenv("SPRINTER_EDGE_TOOLS", str(tmp_path / "no-tools"))
    assert llama_tools.find_tool() is None
    config = results.BenchConfig(methods=["ar", *SERVER_METHODS], humaneval=0, chat=1, explain=0, long=0)
    plan = results.plan(fixture_engine, config)
    assert [s.base_method for s in plan.specs] == ["ar"]
    assert plan.notes == ["llama-server: not built: run tools/build_llama_server.sh"]


def test_tools_key_is_the_wheels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sprinter_edge.backend import buildflags

    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    monkeypatch.setenv("SPRINTER_EDGE_TOOLS", str(tmp_path))
    spec = llama_tools.build_spec()
    assert spec.source == "CMAKE_ARGS in the environment" and spec.version == llama_tools.installed_version()
    assert spec.key == buildflags.wheel_key("-DGGML_NATIVE=OFF -DGGML_AVX2=ON", spec.version)
    assert spec.bin == tmp_path / spec.key / "bin" and llama_tools.where(spec) is None
    spec.bin.mkdir(parents=True)
    for tool in llama_tools.TOOLS:
        (spec.bin / tool).write_text("#!/bin/sh\n")
        (spec.bin / tool).chmod(0o755)
    assert llama_tools.where(spec) == spec.bin
    assert llama_tools.build(spec=spec) == spec.bin  # cached: nothing is downloaded or compiled


@pytest.mark.slow
def test_prompt_lookup_peer_row(fixture_engine, fixture_target_path: Path) -> None:  # type: ignore[no-untyped-def]
    why = peers.unavailable_reason()
    if why:
        pytest.skip(why)  # an AMX CPU: allowed in tests/allowed_skips.toml
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    # a prompt whose reply repeats it: prompt lookup has something to propose
    prompt = fixture_engine.encode("Repeat this line exactly three times: the quick brown fox jumps "
                                   "over the dog")
    ref = fixture_engine.generate(prompt, SamplingParams(max_tokens=16), method="ar")
    long = fixture_engine.encode(prompts.long_prompts(1)[0].text)
    assert len(long) > 512  # longer than n_batch: llama-cpp-python's own scores buffer was too small
    peer = peers.LlamaCppPeer("llama-cpp-lookup", fixture_target_path, lookup=True, n_ctx=2048, n_threads=1)
    try:
        hook = peer.llm.draft_model
        assert isinstance(hook, LlamaPromptLookupDecoding)
        assert (hook.max_ngram_size, hook.num_pred_tokens) == (2, 10)  # llama-cpp-python's defaults
        run = peer.generate(prompt, 16)
        long_run = peer.generate(long, 4)
    finally:
        peer.close()
    assert run.new_tokens > 0 and run.tokens_per_second > 0 and long_run.new_tokens > 0
    # greedy with target-equality acceptance: the target's text (re-tokenized: compare text)
    assert run.text == ref.text
    with pytest.raises(ValueError, match="not both"):
        peers.LlamaCppPeer("x", fixture_target_path, draft=fixture_target_path, lookup=True)


def test_long_context_prompts(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    long = prompts.long_prompts()
    assert len(long) >= 4 and prompts.long_prompts(2) == long[:2]
    for p in long:
        n = len(fixture_engine.encode(p.text))
        assert 1000 <= n <= 3000, (p.id, n)
        fn = p.problem["function"]
        assert p.workload == "long" and p.id == f"long/{p.problem['module']}.{fn}"
        assert f"Quote the function `{fn}`" in p.text
        assert p.problem["quote"].startswith(f"def {fn}(") and p.problem["quote"] in p.text
    assert {p.workload for p in prompts.explain_prompts()} == {"chat"}


def _record(method: str, base_method: str, workload: str, tps: float, seconds: float = 1.0, **stats):  # type: ignore[no-untyped-def]
    return runner.RunRecord(method, f"{workload}/0", workload, "text", [1, 2], stats, 2, seconds,
                            tps, 100.0, rouge_l=1.0 if base_method == "ar" else 0.5)


def test_groups_own_plain_ratio_report_and_plot(tmp_path: Path) -> None:
    specs = [runner.MethodSpec(k, k) for k in ("ar", "llama-server", "llama-server-ngram-mod")]
    server = dict(prefill_seconds=0.2, target_calls=8, predicted_n=11, draft_n=6, draft_n_accepted=2)
    records = [
        _record("ar", "ar", "humaneval", 10.0), _record("ar", "ar", "long", 8.0),
        _record("llama-server", "llama-server", "humaneval", 11.0, **server),
        _record("llama-server", "llama-server", "long", 9.0, **server),
        _record("llama-server-ngram-mod", "llama-server-ngram-mod", "humaneval", 13.2, **server),
        _record("llama-server-ngram-mod", "llama-server-ngram-mod", "long", 18.0, **server),
    ]
    groups = summary.summarize_groups(records, specs)
    assert list(groups) == ["humaneval", "long"]
    mod = {k: next(r for r in rows if r["base_method"] == "llama-server-ngram-mod")
           for k, rows in groups.items()}
    assert mod["humaneval"]["ratio_vs_ar"] == pytest.approx(1.32)
    assert mod["humaneval"]["ratio_vs_plain"] == pytest.approx(1.2)
    assert mod["long"]["ratio_vs_ar"] == pytest.approx(2.25)
    assert mod["long"]["ratio_vs_plain"] == pytest.approx(2.0)
    assert mod["long"]["ttft_seconds"] == pytest.approx(0.2)
    assert mod["long"]["target_calls_per_token"] == pytest.approx(8 / 11)
    assert mod["long"]["draft_accept"] == pytest.approx(2 / 6)
    md = "\n".join(report.group_tables(groups))
    assert "### fresh code (HumanEval)" in md and "### long-context answers" in md and "vs own plain" in md
    assert "pass@1" not in md  # no row of these groups has it: the column is left out
    rows = summary.summarize(records, specs)
    png = plot.plot(rows, tmp_path / "bench.png", groups=groups)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_flat_bound_is_an_upper_bound_with_its_break_even() -> None:
    # the costs measured on a 2-core AMD EPYC Zen 3 (ms per call, last row / all rows)
    t = CostTable(last={1: 42, 2: 66, 4: 115, 8: 312, 16: 312, 24: 511},
                  full={1: 42, 2: 82, 4: 142, 8: 341, 16: 389, 24: 638})
    d = CostTable(last={1: 23, 2: 31, 4: 31, 8: 56, 16: 86, 24: 134},
                  full={1: 23, 2: 31, 4: 38, 8: 74, 16: 130, 24: 200})
    planner = Planner.of(t, d, verifier_ms=0.05)
    b = flat_bound(planner)
    assert b.plan.method != "ar" and b.ratio > 1 > b.measured_ratio
    assert b.ratio == pytest.approx(42 * b.flat.tokens / (b.flat.draft_ms + 42))
    # at the break-even cost of its target call the plan runs exactly at ar's speed
    m = b.measured
    assert (m.draft_ms + b.break_even_ms) / m.tokens == pytest.approx(42)
    assert b.break_even_ms < m.target_ms  # this CPU's batches cost too much for it
    text = "\n".join(b.lines())
    assert "UPPER bound" in text and "formula: ms/token" in text and "to cost <=" in text
    # the raw curve's 16-multiples (llama-bench, target, 2 threads)
    curve = {1: 42, 12: 393, 15: 491, 16: 381, 17: 465, 31: 700, 32: 646}
    assert [n for n, *_ in dips(curve)] == [16, 17, 32]


@pytest.mark.slow
def test_doctor_curve_is_raw_and_names_the_16_multiples(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    from sprinter_edge.cli.models import _curve_lines

    lines = _curve_lines(fixture_engine.target)
    assert lines[0].startswith("  target curve") and all(f" {n}: " in lines[0] for n in (1, 12, 16, 32))
    assert any(line.strip().startswith("n=16: ") for line in lines)
    assert any(line.strip().startswith("n=32: ") for line in lines)


def test_a_server_row_with_settings_of_its_own() -> None:
    """`CONFIG[key=value,...]` adds llama.cpp's options of that configuration's --spec-type, one
    process per row; a bad one is a clear error."""
    from sprinter_edge.bench.llama_server import LlamaServer, parse_server_row, server_base

    row = "llama-server-ngram-mod[n-match=16,n-min=8]"
    assert runner.split_methods(f"ar,{row}, llama-server-draft[n-max=8]") == [
        "ar", row, "llama-server-draft[n-max=8]"]
    assert parse_server_row(row) == ("llama-server-ngram-mod",
                                     ("--spec-ngram-mod-n-match", "16", "--spec-ngram-mod-n-min", "8"))
    assert parse_server_row("llama-server-ngram-mod") is None and server_base(row) == "llama-server-ngram-mod"
    spec = runner.expand_methods([row], None)[1]
    assert (spec.label, spec.base_method) == (row, "llama-server-ngram-mod") and not spec.needs_draft
    server = LlamaServer(spec.base_method, Path("llama-server"), Path("t.gguf"), options=spec.server_options)
    assert server.args[-4:] == ["--spec-ngram-mod-n-match", "16", "--spec-ngram-mod-n-min", "8"]
    for bad in ("llama-server[n-max=3]", "llama-server-ngram-mod[n-match]", "llama-server-ngram-mod[a=b c]"):
        with pytest.raises(ValueError):
            runner.expand_methods([bad], None)
