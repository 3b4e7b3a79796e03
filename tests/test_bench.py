"""The benchmark harness on the fixture pair (real models, tiny runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprinter_edge import SamplingParams
from sprinter_edge.bench import costmodel, quality
from sprinter_edge.bench.prompts import humaneval_prompts
from sprinter_edge.cli import main


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
        pytest.skip("no working `unshare -n` here")
    probe = ("import socket\ns = socket.socket()\ns.settimeout(2)\n"
             "try:\n    s.connect(('1.1.1.1', 53))\nexcept OSError:\n    raise SystemExit(0)\n"
             "raise SystemExit(1)\n")
    assert quality.run_program(probe, timeout=10).passed


def test_cost_model_predicts_ar(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    table = costmodel.measure(fixture_engine.target, (1, 2, 4, 8), repeats=3)
    assert table.cost(1) > 0 and table.cost(8, 8) > 0 and table.cost(5, 2) > 0
    model = costmodel.CostModel(table, costmodel.measure(fixture_engine.draft, (1, 2, 4), repeats=2))
    res = fixture_engine.generate("Write a haiku about the sea.", SamplingParams(max_tokens=24), method="ar")
    predicted = model.predict_tps(res.stats)
    measured = res.stats.tokens_per_second
    assert predicted > 0 and measured > 0
    assert 1 / 3 < predicted / measured < 3, (predicted, measured)


def test_bench_quick_end_to_end(fixture_target_path: Path, fixture_draft_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    rc = main(["bench", "--target", str(fixture_target_path), "--draft", str(fixture_draft_path),
               "--quick", "--threads", "2", "--verifier", "confidence", "--thresholds", "0.5",
               "--humaneval", "1", "--chat", "0", "--no-warmup", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    kinds = {r["kind"] for r in data["rows"]}
    assert {"ar", "sd", "sprinter", "oracle", "draft"} <= kinds
    if "llama-cpp rows skipped" not in " ".join(data["notes"]):
        assert {"llama-cpp", "llama-cpp-draft"} <= kinds
    ar = next(r for r in data["rows"] if r["kind"] == "ar")
    assert ar["ratio_vs_ar"] == pytest.approx(1.0) and ar["exact_match"] == 1.0
    assert ar["predicted_tps"] > 0 and ar["pass_at_1"] is not None
    sprinter = next(r for r in data["rows"] if r["kind"] == "sprinter")
    assert sprinter["eta_fp"] is not None and "time_split" in sprinter
    assert "| method |" in (out / "bench.md").read_text()
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
