"""The benchmark harness on the fixture pair (real models, tiny runs)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.clock import CallClock

from sprinter_edge import SamplingParams
from sprinter_edge.bench import costmodel, quality, runner, summary
from sprinter_edge.bench.prompts import BenchPrompt, humaneval_prompts
from sprinter_edge.cli import main
from sprinter_edge.decoding import Origin
from sprinter_edge.decoding.sampling import distribution
from sprinter_edge.errors import SprinterError
from sprinter_edge.numerics import total_variation


def test_rouge_l_known_strings() -> None:
    assert quality.rouge_l("the cat sat on the mat", "the cat sat on the mat") == 1.0
    assert quality.rouge_l("a b c", "x y z") == 0.0
    # LCS("the cat sat", "the dog sat") = 2 -> P = R = 2/3
    assert quality.rouge_l("the cat sat", "the dog sat") == pytest.approx(2 / 3)
    # LCS = 3 ("a c e"); P = 3/5, R = 3/3 -> F = 0.75
    assert quality.rouge_l("a b c d e", "a c e") == pytest.approx(0.75)
    assert quality.lcs_length("ABCBDAB", "BDCABA") == 4
    assert quality.token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (False, 0.5)
    assert quality.token_agreement([1, 2], [1, 2]) == (True, 1.0)


def test_humaneval_execution_correct_wrong_and_timeout() -> None:
    problem = humaneval_prompts(1)[0].problem  # HumanEval/0: has_close_elements
    good = ("```python\nfrom typing import List\n\n"
            "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
            "               for j, b in enumerate(numbers) if i != j)\n```")
    bad = ("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    slow = ("```python\ndef has_close_elements(numbers, threshold):\n    while True:\n"
            "        pass\n```")
    assert quality.check_humaneval(problem, good, timeout=10).status == "passed"
    assert quality.check_humaneval(problem, bad, timeout=10).status == "failed"
    res = quality.check_humaneval(problem, slow, timeout=1.5)
    assert res.status == "timeout" and not res.passed and res.seconds < 6


def test_humaneval_code_has_no_network() -> None:
    if not quality.network_isolation():
        pytest.fail("no working `unshare -n` (root) or `unshare -rn` (user namespaces) here: "
                    "HumanEval's code would run with network access")
    # A listener on this machine's loopback: reachable from here, not from a namespace of its own
    # (no traffic ever leaves the machine, whether the sandbox holds or not)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = (f"import socket\ns = socket.socket()\ns.settimeout(2)\n"
                 f"try:\n    s.connect(('127.0.0.1', {port}))\nexcept OSError:\n    raise SystemExit(0)\n"
                 "raise SystemExit(1)\n")
        assert quality.run_program(probe, timeout=10).passed
        reachable = probe.replace("SystemExit(0)", "SystemExit(2)").replace("SystemExit(1)", "SystemExit(0)")
        assert subprocess.run([sys.executable, "-c", reachable], timeout=10).returncode == 0


@pytest.mark.slow
def test_cost_model_predicts_ar(fixture_engine, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The cost model prices a reply's logged calls as they cost: with every call charged its
    table's price (a clock only the model calls move), the predicted tok/s is the measured one,
    for `ar` and for `sd` (draft calls, multi-row target calls). How close the prediction comes
    to real timings on this machine is the bench's "pred tok/s" against "tok/s" (the default
    pair's runs were within 4%), not a bound on a shared CPU here."""
    table = costmodel.measure(fixture_engine.target, (1, 2, 4, 8), repeats=5)
    assert table.cost(1) > 0 and table.cost(8, 8) > 0 and table.cost(5, 2) > 0
    draft_table = costmodel.measure(fixture_engine.draft, (1, 2, 4), repeats=2)
    model = costmodel.CostModel(table, draft_table)
    clock = CallClock()
    for name, model_, priced in (("target", fixture_engine.target, table),
                                 ("draft", fixture_engine.draft, draft_table)):
        clock.charge(monkeypatch, model_, name,
                     lambda n, rows, depth, priced=priced: priced.cost(n, rows) / 1e3 if n else 0.0)
    for method in ("ar", "sd"):
        gen = fixture_engine.stream("Write a long story about the sea.", SamplingParams(max_tokens=96),
                                    method=method)
        gen.ctx.clock = clock
        res = gen.consume()
        assert res.stats.counters.new_tokens == 96  # the fixture does not stop early on this prompt
        predicted = model.predict_tps(res.stats)
        measured = res.stats.tokens_per_second
        assert measured > 0 and predicted == pytest.approx(measured, rel=1e-9), (method, predicted, measured)
        log = res.stats.calls.target  # every target call logged, by size, rows and depth
        assert sum(log.values()) == res.stats.counters.target_calls
        assert sum(n * k for (n, _, _), k in log.items()) == res.stats.counters.target_tokens
    assert res.stats.calls.draft and any(n > 1 for n, _, _ in res.stats.calls.target)  # sd's were priced


def test_cost_model_prices_each_call_not_the_mean_call() -> None:
    """One 32-token call and three 1-token calls: priced call by call, not as four calls of
    8.75 tokens (the curve is not linear: the mean call misprices a mix)."""
    from sprinter_edge.costs.table import CostTable
    from sprinter_edge.decoding import Stats

    table = CostTable(last={1: 50.0, 8: 80.0, 16: 150.0, 32: 300.0},
                      full={1: 50.0, 8: 100.0, 16: 200.0, 32: 400.0})
    st = Stats()
    st.counters.new_tokens, st.counters.target_calls, st.counters.target_tokens = 35, 4, 35
    st.counters.target_rows = 35
    for n in (32, 1, 1, 1):
        st.calls.add("target", n, n, depth=100)
    model = costmodel.CostModel(table)
    assert model.predict_seconds(st) == pytest.approx((400 + 3 * 50) / 1e3)
    mean_priced = Stats(counters=st.counters)  # no call log (a JSON record): the mean call
    assert model.predict_seconds(mean_priced) == pytest.approx(4 * table.cost(35 / 4, 35 / 4) / 1e3)
    assert model.predict_seconds(st, flat=True) == pytest.approx(4 * 50 / 1e3)


def test_floor_is_every_token_a_row_of_the_cheapest_call_at_its_depth() -> None:
    """The floor prices each token at the cheapest all-rows cost per row (here 32 or 64 rows
    at 12.5 ms a row against a 50 ms step: 4x ar), the deeper spans at the deeper table's costs."""
    from sprinter_edge.costs import CostTable

    table = CostTable(last={1: 50.0, 8: 80.0, 16: 150.0, 32: 300.0, 64: 600.0},
                      full={1: 50.0, 8: 100.0, 16: 240.0, 32: 400.0, 64: 800.0})
    model = costmodel.CostModel(table)
    assert model.floor_ratio([(10, 300)]) == pytest.approx(4.0)
    assert model.floor_ratio([]) is None
    # after 1,000 tokens a step costs twice as much and a 32-row call three times: 2 / 3 of it
    deeper = CostTable(last={1: 100.0}, full={32: 1200.0})
    table.deep = {1000: deeper, 2000: deeper}
    assert model.floor_ratio([(1000, 128)]) == pytest.approx(4.0 * 2 / 3, rel=1e-6)


@pytest.fixture(scope="module")
def quick_bench(fixture_target_path: Path, fixture_draft_path: Path,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One `bench --quick` run on the fixture pair, peers included: (bench.json, its folder)."""
    out = tmp_path_factory.mktemp("quick") / "bench"
    rc = main(["bench", "--target", str(fixture_target_path), "--draft", str(fixture_draft_path),
               "--quick", "--threads", "2", "--verifier", "confidence", "--thresholds", "0.5",
               "--humaneval", "1", "--chat", "0", "--no-warmup", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    return json.loads((out / "bench.json").read_text()), out


def _skip_if_noted(data: dict, start: str) -> None:
    """Skip, with the bench's own reason, where the bench noted it left these rows out (an
    AMX CPU: allowed in tests/allowed_skips.toml)."""
    note = next((n for n in data["notes"] if n.startswith(start)), None)
    if note is not None:
        pytest.skip(note)


@pytest.mark.slow
def test_bench_quick_llama_cpp_rows(quick_bench: tuple[dict, Path]) -> None:
    data, _ = quick_bench
    _skip_if_noted(data, "llama-cpp rows skipped")
    assert {"llama-cpp", "llama-cpp-draft", "llama-cpp-lookup"} <= {r["base_method"] for r in data["rows"]}


@pytest.mark.slow
def test_bench_quick_llama_server_rows(quick_bench: tuple[dict, Path]) -> None:
    from sprinter_edge.bench.results import SERVER_MISSING_NOTE

    data, _ = quick_bench
    if SERVER_MISSING_NOTE in data["notes"]:
        pytest.fail(f"{SERVER_MISSING_NOTE} (tools/setup.sh --dev builds it)")
    assert set(runner.SERVER_METHODS) <= {r["base_method"] for r in data["rows"]}  # each its own process
    assert set(data["config"]["llama_server"]["commands"]) == set(runner.SERVER_METHODS)
    plain = next(r for r in data["rows"] if r["base_method"] == "llama-server")
    tuned = next(r for r in data["rows"] if r["base_method"] == "llama-server-draft-tuned")
    assert plain["ratio_vs_plain"] == pytest.approx(1.0) and tuned["ratio_vs_plain"] > 0
    assert tuned["ttft_seconds"] > 0 and tuned["target_calls_per_token"] is not None
    runs = [r for r in data["runs"] if r["method"] == "llama-server"]
    assert all(r["tokens_per_second"] == pytest.approx(r["stats"]["predicted_per_second"], rel=1e-3)
               for r in runs if r["stats"]["predicted_n"] > 1)


@pytest.mark.slow
def test_bench_quick_end_to_end(quick_bench: tuple[dict, Path]) -> None:
    data, out = quick_bench
    methods = {r["base_method"] for r in data["rows"]}
    assert {"ar", "sd", "sprinter", "oracle", "draft"} <= methods
    ar = next(r for r in data["rows"] if r["base_method"] == "ar")
    assert ar["ratio_vs_ar"] == pytest.approx(1.0) and ar["exact_match"] == 1.0
    assert ar["predicted_tps"] > 0 and ar["pass_at_1"] is not None
    sprinter = next(r for r in data["rows"] if r["base_method"] == "sprinter")
    assert sprinter["eta_fp"] is not None and "time_split" in sprinter
    md = (out / "bench.md").read_text()
    assert "| method |" in md and "TV drift/tok" in md and "FP mass/tok" in md and "TV bound" not in md
    # the TV figures recomputed from the raw per-token values of the runs (greedy run)
    for row in (r for r in data["rows"] if r["base_method"] in ("sprinter", "oracle")):
        runs = [r for r in data["runs"] if r["method"] == row["method"] and r["false_pass"]]
        assert runs
        kept = [k for r in runs for k in r["false_pass"]["per_token"]["kept"]]
        tv = [t for r in runs for t in r["false_pass"]["per_token"]["tv"]]
        greedy = [g for r in runs for g in r["false_pass"]["per_token"]["greedy"]]
        differs = [d for r in runs for d in r["false_pass"]["per_token"]["argmax_differs"]]
        assert len(kept) == len(tv) == len(greedy) == sum(len(r["tokens"]) for r in runs)
        assert all(r["false_pass"]["sampling"]["greedy"] for r in runs)
        assert tv == differs and set(tv) <= {0, 1}  # greedy: TV of one-hot distributions
        assert sum(kept) == sum(r["stats"]["kept"] for r in runs)
        drift = sum(k * t for k, t in zip(kept, tv, strict=True)) / len(tv)
        fp = sum(k * (1 - g) for k, g in zip(kept, greedy, strict=True))
        rejected = sum(r["false_pass"]["rejected"] for r in runs)
        eta = fp / (fp + rejected) if fp + rejected else 0.0
        assert row["tv_drift"] == pytest.approx(drift) and row["eta_fp"] == pytest.approx(eta)
        reject = [x for r in runs for x in r["false_pass"]["per_token"]["reject"]]
        kept_pairs = [(x, t) for k, x, t in zip(kept, reject, tv, strict=True) if k]
        assert all(x == t for x, t in kept_pairs)  # greedy: a kept draft argmax is rejected iff
        fp_mass = sum(k * x for k, x in zip(kept, reject, strict=True)) / len(tv)  # argmaxes differ
        assert row["fp_mass"] == pytest.approx(fp_mass) == pytest.approx(drift)
        assert row["eta_fp_x_p_differs"] == pytest.approx(eta * sum(differs) / len(differs))
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_bench_with_a_target_alone(fixture_target_path: Path, tmp_path: Path) -> None:
    """One model: the rows that draft are left out with one note, the rest run (auto among
    ar and lookup), and nothing asks for a draft or a verifier."""
    out = tmp_path / "bench"
    rc = main(["bench", "--target", str(fixture_target_path), "--quick", "--threads", "2",
               "--methods", "ar,auto,lookup,sd,sprinter,llama-cpp-draft", "--humaneval", "0", "--chat", "1",
               "--no-warmup", "--no-peers", "--out", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert [r["base_method"] for r in data["rows"]] == ["ar", "auto", "lookup"]
    assert "no draft model: sd, sprinter skipped" in data["notes"]  # --no-peers took the peer row
    assert data["config"]["draft"] is None and data["rows"][1]["predicted_tps"] > 0


@pytest.mark.slow
def test_the_warmup_teaches_auto_nothing(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """The warmup's 8 tokens per row are not evidence for auto's planner (they once made it
    run `ar` on the first edit task: a reply's first tokens copy nothing)."""
    specs = runner.expand_methods(["ar", "auto"], None)
    bench = runner.Runner(fixture_engine, specs, runner.RunConfig(max_tokens=12, rescore="none"))
    try:
        records = bench.run([BenchPrompt("chat/0", "Name three colours.")])
    finally:
        bench.close()
    auto = next(r for r in records if r.method == "auto")
    assert sum(fixture_engine.planner().ran.values()) == len(auto.tokens) > 0


class _Rows:
    """A stand-in model whose `sync` returns fixed logits (one row per position)."""

    n_batch = 512

    def __init__(self, probs: list[list[float]]):
        self.logits = np.log(np.array(probs + [[1 / 3, 1 / 3, 1 / 3]], np.float32))

    def sync(self, context: list[int], n_logits: int) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits[-n_logits:])


# Target p and draft q at four positions; tokens and origins as a greedy SPRINTER run makes them.
P = [[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.1, 0.7, 0.2], [0.5, 0.3, 0.2]]
Q = [[0.2, 0.3, 0.5], [0.6, 0.3, 0.1], [0.2, 0.6, 0.2], [0.2, 0.3, 0.5]]
TOKENS = [2, 0, 1, 0]  # 2: the draft's argmax kept (a false pass); 0 at the end: the target's replacement
ORIGINS = [Origin.KEPT, Origin.ACCEPTED, Origin.KEPT, Origin.RESAMPLED]


def test_tv_drift_hand_made_greedy_and_temperature() -> None:
    target, draft = _Rows(P), _Rows(Q)
    # greedy: one-hot p and q, TV = 1[argmax differs] = [1, 0, 0, 1]
    s = quality.score_tokens(target, [5], TOKENS, draft, SamplingParams(temperature=0))
    assert s is not None and s.tv.tolist() == [1, 0, 0, 1]
    fp = quality.false_pass(ORIGINS, s, rejected=1)
    assert (fp.kept, fp.false_pass, fp.eta_fp) == (2, 1, 0.5)
    assert fp.tv_drift == pytest.approx(1 / 4)  # kept * TV = [1, 0, 0, 0]
    assert fp.p_argmax_differs == 0.5 and fp.eta_fp * fp.p_argmax_differs == pytest.approx(fp.tv_drift)
    # the SD rejection of the drawn token: position 0 (draft argmax 2, target argmax 0) only
    assert s.reject.tolist() == [1, 0, 0, 0] and fp.fp_mass == pytest.approx(1 / 4)
    # temperature 1: TV = [0.3, 0, 0.1, 0.3]; kept positions 0 and 2
    s1 = quality.score_tokens(target, [5], TOKENS, draft, SamplingParams(temperature=1.0))
    assert s1.tv == pytest.approx([0.3, 0.0, 0.1, 0.3], abs=1e-6)
    fp1 = quality.false_pass(ORIGINS, s1, rejected=1)
    assert fp1.tv_drift == pytest.approx((0.3 + 0.1) / 4, abs=1e-6)
    assert fp1.eta_fp == 0.5 and fp1.eta_fp * fp1.p_argmax_differs == pytest.approx(0.25)  # not the drift
    # 1 - min(1, p(x)/q(x)) of the drawn tokens: 1 - 0.2/0.5 at position 0, else p(x) >= q(x)
    assert s1.reject == pytest.approx([0.6, 0.0, 0.0, 0.0], abs=1e-6)
    assert fp1.fp_mass == pytest.approx(0.6 / 4, abs=1e-6)
    # averaged over x ~ q it is TV(p, q): what a verifier blind to x drifts by
    for p, q in zip(P, Q, strict=True):
        _, rej = quality.sampled_divergence(np.log([p] * 3), np.log([q] * 3), np.arange(3),
                                            SamplingParams(temperature=1.0))
        assert float(np.dot(q, rej)) == pytest.approx(total_variation(p, q), abs=1e-9)
    # position 2 alone: eta_FP = 0 (the kept token is the target's argmax), drift 0.1 at T = 1
    alone = quality.false_pass([Origin.KEPT], quality.score_tokens(
        _Rows(P[2:3]), [5], [1], _Rows(Q[2:3]), SamplingParams(temperature=1.0)), rejected=0)
    assert alone.eta_fp == 0 and alone.tv_drift == pytest.approx(0.1, abs=1e-6)
    # temperature 2 (p^(1/2) normalised) and top-k: the sampler's own transform
    half = [0.5 * np.abs(np.sqrt(p) / np.sqrt(p).sum() - np.sqrt(q) / np.sqrt(q).sum()).sum()
            for p, q in zip(P, Q, strict=True)]
    t2, _ = quality.sampled_divergence(np.log(P), np.log(Q), TOKENS, SamplingParams(temperature=2.0))
    assert t2 == pytest.approx(half)
    topk = SamplingParams(temperature=0.7, top_k=2, top_p=0.9)
    want = [total_variation(distribution(np.log(p), topk), distribution(np.log(q), topk))
            for p, q in zip(P, Q, strict=True)]
    assert quality.sampled_divergence(np.log(P), np.log(Q), TOKENS, topk)[0] == pytest.approx(want)
    # several runs: token-weighted, from the stored per-token values
    import dataclasses

    tot = quality.tv_totals([dataclasses.asdict(fp1), dataclasses.asdict(alone)])
    assert tot["tokens"] == 5 and not tot["greedy"]
    assert tot["tv_drift"] == pytest.approx((0.3 + 0.1 + 0.1) / 5, abs=1e-6)
    assert tot["fp_mass"] == pytest.approx(0.6 / 5, abs=1e-6)


def test_bench_runs_at_temperature_one(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    specs = runner.expand_methods(["sprinter"], [0.5], (), ["confidence", "never-flag"])
    cfg = runner.RunConfig(max_tokens=12, temperature=1.0, warmup=False, seed=3)
    bench = runner.Runner(fixture_engine, specs, cfg)
    resets = []
    reset = fixture_engine.reset_caches
    fixture_engine.reset_caches = lambda: (resets.append(1), reset())  # type: ignore[method-assign]
    try:
        records = bench.run([BenchPrompt("chat/t1", "Write a haiku about the sea.")])
    finally:
        del fixture_engine.reset_caches
    rows = summary.summarize(records, specs)
    # every row read its prompt from empty caches (comparable time to first token)
    assert len(resets) == len(records) == 3
    assert fixture_engine.target.tokens and fixture_engine.draft.tokens
    fixture_engine.reset_caches()
    assert not fixture_engine.target.tokens and not fixture_engine.draft.tokens
    # the verifier of each row is its own: never-flag keeps every drafted token it scores
    by_label = {r.method: r.stats for r in records}
    assert by_label["sprinter@0.5[never-flag]"]["verifier"] == "never-flag"
    assert by_label["sprinter@0.5[never-flag]"]["flags"] == 0
    assert by_label["sprinter@0.5[confidence]"]["verifier"] == "confidence"
    row = next(r for r in rows if r["method"] == "sprinter@0.5[confidence]")
    fp = next(r for r in records if r.method == row["method"]).false_pass
    assert fp is not None and fp["sampling"] == {"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                                 "greedy": False}
    pt = fp["per_token"]
    assert all(0 <= t <= 1 for t in pt["tv"]) and len(pt["tv"]) == fp["tokens"]
    assert row["tv_drift"] == pytest.approx(sum(k * t for k, t in zip(pt["kept"], pt["tv"], strict=True))
                                            / fp["tokens"])
    assert row["tv_drift"] <= row["mean_tv"] + 1e-12
    assert all(0 <= r <= 1 for r in pt["reject"]) and len(pt["reject"]) == fp["tokens"]
    assert row["fp_mass"] == pytest.approx(sum(k * r for k, r in zip(pt["kept"], pt["reject"], strict=True))
                                           / fp["tokens"])
    assert row["eta_fp_x_p_differs"] is None  # greedy only


def test_pass_rate_intervals() -> None:
    from sprinter_edge.bench.intervals import paired_difference, wilson

    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)  # the textbook value
    lo, hi = wilson(67, 80)
    assert lo == pytest.approx(0.7416, abs=1e-3) and hi == pytest.approx(0.9025, abs=1e-3)
    same = [True, False] * 40
    assert paired_difference(same, same) == (0.0, 0.0, 0.0)
    worse = list(same)
    for i in (0, 2, 4, 6):
        worse[i] = False  # 4 of 80 problems lost: -5 points, and the interval excludes 0
    d, lo, hi = paired_difference(worse, same)
    assert d == pytest.approx(-0.05) and lo < d < hi < 0
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])
    # the table shows the point difference with its interval
    from sprinter_edge.bench.report import markdown_table

    row = {"method": "s", "pass_diff_vs_ar": d, "pass_diff_ci": [lo, hi]}
    table = markdown_table([{"method": "ar"}, row])
    assert f"| {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] |" in table


def test_old_results_keys_are_still_read(tmp_path: Path) -> None:
    """bench.json files written before the renames name a row's base_method "kind" and a run's
    workload "prompt_kind": the readers take either."""
    from sprinter_edge.bench import plot, results

    new = {"method": "llama-cpp", "base_method": "llama-cpp", "ratio_vs_ar": 1.2, "rouge_l": 0.9}
    old = {"method": "sd", "kind": "sd", "exact_match": 0.9, "ratio_vs_ar": 1.5, "rouge_l": 1.0}
    assert [summary.base_method_of(r) for r in (new, old)] == ["llama-cpp", "sd"]
    assert summary.workload_of({"workload": "edit"}) == summary.workload_of({"prompt_kind": "edit"}) == "edit"
    notes = results.run_notes([old, new])
    assert results.BATCH_NOTE in notes and results.PEER_TIMING_NOTE in notes
    assert plot.plot([old, new], tmp_path / "bench.png").is_file()
    rec = runner.RunRecord("sprinter@0.5", "chat/0", "chat", "", [], {}, 0, 1.0, 0.0, 0.0)
    assert rec.to_dict()["workload"] == "chat" and "prompt_kind" not in rec.to_dict()
    row = summary.summarize([rec], [runner.MethodSpec("sprinter@0.5", "sprinter", 0.5)])[0]
    assert row["method"] == "sprinter@0.5" and row["base_method"] == "sprinter" and "kind" not in row


def test_preset_rows_are_resolved_by_the_engine() -> None:
    specs = runner.expand_methods(["ar", "sprinter"], [], ["quality", "balanced"])
    assert [(s.label, s.preset, s.threshold) for s in specs] == [
        ("ar", None, None), ("sprinter:quality", "quality", None), ("sprinter:balanced", "balanced", None)]
    by_threshold = runner.expand_methods(["sprinter"], [0.5], ["quality"])
    assert [s.label for s in by_threshold] == ["ar", "sprinter@0.5"]
    # several verifiers: the sprinter rows once per verifier, side by side
    both = runner.expand_methods(["ar", "sprinter"], [], ["balanced"], ["auto", "hidden"])
    assert [(s.label, s.verifier) for s in both] == [
        ("ar", None), ("sprinter:balanced[auto]", "auto"), ("sprinter:balanced[hidden]", "hidden")]
    assert [s.verifier for s in runner.expand_methods(["sprinter"], [0.5], (), ["auto"])] == [None, None]


def test_bench_flags_resolve_to_a_config() -> None:
    from sprinter_edge.cli import build_parser
    from sprinter_edge.cli.bench import config_from

    def cfg(*flags: str):  # type: ignore[no-untyped-def]
        return config_from(build_parser().parse_args(["bench", *flags]))

    c = cfg("--thresholds", "balanced", "--verifier", "auto,hidden", "--temperature", "0.7", "--seed", "5")
    assert c.thresholds is None and tuple(c.presets) == ("balanced",)
    assert list(c.verifiers) == ["auto", "hidden"] and c.temperature == 0.7 and c.seed == 5
    c = cfg("--thresholds", "0.5,0.7")
    assert c.thresholds == [0.5, 0.7] and not c.verifiers and c.temperature == 0.0
    assert tuple(cfg().presets) == ("quality", "balanced", "fast") and cfg().thresholds is None
    with pytest.raises(SprinterError, match="preset names"):
        cfg("--thresholds", "balanced,0.x")
    with pytest.raises(SprinterError, match="temperature"):
        cfg("--temperature", "-1")
    c = cfg("--long", "2", "--explain", "1", "--chat", "0")
    assert (c.long, c.explain, c.chat) == (2, 1, 0) and c.server_ctx == 4096
    assert (cfg("--quick").long, cfg("--quick").explain) == (0, 0)
    assert "llama-server-ngram-mod" in cfg().methods and "llama-cpp-lookup" in cfg().methods
    with pytest.raises(SprinterError, match="--long must be >= 0"):
        cfg("--long", "-1")


@pytest.mark.slow
def test_bench_edit_tasks_end_to_end(fixture_target_path: Path, fixture_draft_path: Path,
                                     tmp_path: Path) -> None:
    """--edits: each run's reply checked (runs[].edit), the edit pass rate per row with its
    interval and the paired difference from ar, and the by-kind table in bench.md."""
    out = tmp_path / "bench"
    rc = main(["bench", "--target", str(fixture_target_path), "--draft", str(fixture_draft_path),
               "--methods", "ar,sd", "--humaneval", "0", "--chat", "0", "--explain", "0", "--long", "0",
               "--edits", "2",
               "--max-tokens", "24", "--threads", "2", "--no-peers", "--no-cost-model", "--no-warmup",
               "--rescore", "none", "--out", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    runs = [r for r in data["runs"] if r["workload"] == "edit"]
    assert len(runs) == 4 and all(set(r["edit"]) >= {"passed", "edit", "why"} for r in runs)
    assert all(r["edit"]["passed"] or r["edit"]["why"] for r in runs)
    ar, sd = (next(r for r in data["rows"] if r["base_method"] == k) for k in ("ar", "sd"))
    assert ar["edit_n"] == sd["edit_n"] == 2 and len(sd["edit_ci"]) == 2 and "edit_diff_ci" in sd
    assert sum(v[1] for v in ar["edit_by_kind"].values()) == 2
    md = (out / "bench.md").read_text()
    assert "| edit pass |" in md and "## edit tasks passed, by kind" in md


@pytest.mark.slow
def test_a_prediction_row_sends_the_edit_input(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    """`lookup+prediction` runs lookup with the task's input code as the Predicted Output: its
    reply is ar's (exact) and its counters say how much of the prediction it used."""
    from sprinter_edge.bench import edits

    prompt = edits.FUNCTIONS.prompts(1)[0]
    specs = runner.expand_methods(["ar", "lookup+prediction"], None)
    assert specs[1].prediction and specs[1].engine_method == "lookup"
    bench = runner.Runner(fixture_engine, specs, runner.RunConfig(max_tokens=40, rescore="none",
                                                                  warmup=False))
    try:
        ar, predicted = bench.run([prompt])
    finally:
        bench.close()
    assert predicted.method == "lookup+prediction" and predicted.tokens == ar.tokens
    assert predicted.stats["accepted_prediction_tokens"] > 0
    assert "accepted_prediction_tokens" not in ar.stats
