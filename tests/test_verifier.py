"""Verifier training pipeline on real (tiny) data from the fixture pair: collect, train,
export, load, check, calibrate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sprinter_edge import SamplingParams
from sprinter_edge.errors import VerifierError
from sprinter_edge.training.collect import CollectConfig, collect, load_data
from sprinter_edge.training.corpus import load_corpus
from sprinter_edge.training.export import export, parity
from sprinter_edge.training.features import feature_matrix, labels, split_by_prompt
from sprinter_edge.training.models import candidate
from sprinter_edge.training.ship import train_and_export
from sprinter_edge.training.train import TrainConfig
from sprinter_edge.verifiers.base import DraftFeatures
from sprinter_edge.verifiers.calibration import (
    calibration_table,
    threshold_for_max_fp,
    verifier_threshold_for_max_fp,
)
from sprinter_edge.verifiers.loading import resolve_verifier
from sprinter_edge.verifiers.onnx import OnnxVerifier
from sprinter_edge.verifiers.simple import Confidence

N_PROMPTS = 9
N_TOKENS = 16


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, fixture_engine) -> Path:
    out = tmp_path_factory.mktemp("vdata")
    cfg = CollectConfig(max_new_tokens=N_TOKENS, shard_size=3, limit=N_PROMPTS)
    summary = collect(fixture_engine.draft, fixture_engine.target, load_corpus(), out, cfg, progress=False)
    assert summary.shards_written == N_PROMPTS // 3
    return out


@pytest.fixture(scope="module")
def trained(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("ver") / "fixture.onnx"
    cfg = TrainConfig(candidates=("logreg-maxprob", "logreg-conf", "logreg-hidden"))
    result, report = train_and_export(data_dir, out, cfg, pair_name="fixture")
    return out, result, report


def test_corpus_is_large_and_unique() -> None:
    corpus = load_corpus()
    assert len(corpus.prompts) >= 300
    assert len({p.prompt for p in corpus.prompts}) == len(corpus.prompts)
    assert {"code_write", "code_explain", "chat"} <= {p.category for p in corpus.prompts}
    assert not any("HumanEval" in p.prompt for p in corpus.prompts)


def test_collected_data_is_consistent(data_dir: Path, fixture_engine) -> None:
    data, meta = load_data(data_dir)
    n = len(data["token"])
    assert 0 < n <= N_PROMPTS * N_TOKENS
    assert data["hidden"].shape == (n, fixture_engine.draft.n_embd)
    assert data["hidden"].dtype == np.float16
    assert np.all((data["max_prob"] > 0) & (data["max_prob"] <= 1))
    assert np.all((data["tv"] >= 0) & (data["tv"] <= 1 + 1e-6))
    np.testing.assert_array_equal(data["label_greedy"], data["token"] == data["target_token"])
    np.testing.assert_array_equal(data["label_paper"], data["q_x"] <= data["p_x"])
    assert meta["pair"]["draft"]["fingerprint"] == fixture_engine.draft.fingerprint()
    assert meta["pair"]["target"]["fingerprint"] == fixture_engine.target.fingerprint()
    assert set(meta["label_rules"]) == {"greedy", "paper"}


def test_collect_resumes_without_redoing_shards(data_dir: Path, fixture_engine) -> None:
    cfg = CollectConfig(max_new_tokens=N_TOKENS, shard_size=3, limit=N_PROMPTS)
    summary = collect(fixture_engine.draft, fixture_engine.target, load_corpus(), data_dir, cfg,
                      progress=False)
    assert summary.shards_written == 0 and summary.shards_skipped == N_PROMPTS // 3


def test_split_is_by_prompt(data_dir: Path) -> None:
    data, _ = load_data(data_dir)
    masks = split_by_prompt(data["prompt_index"], (0.6, 0.2, 0.2), seed=0)
    groups = [set(data["prompt_index"][m]) for m in masks]
    assert not (groups[0] & groups[1]) and not (groups[0] & groups[2]) and not (groups[1] & groups[2])
    assert sum(int(m.sum()) for m in masks) == len(data["token"])


def test_onnx_parity_on_held_out_rows(data_dir: Path, tmp_path: Path, trained) -> None:
    _, result, report = trained
    assert report["onnx_parity_max_abs_diff"] <= 1e-5
    # the paper's verifier (scaler + logistic regression on the hidden state), exported as is
    data, meta = load_data(data_dir)
    y = labels(data, "greedy")
    tr, _, te = split_by_prompt(data["prompt_index"], (0.6, 0.2, 0.2))
    c = candidate("logreg-hidden")
    x = feature_matrix(data, c.layout)
    pipe = c.build(x.shape[1]).fit(x[tr], y[tr])
    path = export(pipe, tmp_path / "paper.onnx", layout=c.layout, n_features=x.shape[1],
                  pair=meta["pair"], label_rule="greedy", default_threshold=0.5, presets={},
                  table=result.table, metrics={}, tv_pq=0.1)
    assert parity(pipe, path, x[te]) <= 1e-5


def test_shipped_file_loads_and_scores(trained, fixture_engine) -> None:
    path, result, _ = trained
    ver = resolve_verifier(str(path), None, fixture_engine.draft, fixture_engine.target)
    assert isinstance(ver, OnnxVerifier)
    assert ver.layout == result.chosen.layout
    assert ver.needs_hidden == ("hidden" in ver.layout)
    assert set(ver.presets) == {"quality", "balanced", "fast"}
    assert ver.threshold_for(None) == ver.default_threshold
    logits = np.zeros(fixture_engine.draft.n_vocab, np.float32)
    logits[3] = 5.0
    f = DraftFeatures(hidden=np.ones(fixture_engine.draft.n_embd, np.float32), logits=logits, token=3,
                      run_position=0, output_position=0)
    assert 0.0 <= ver.score(f) <= 1.0


def test_sprinter_generates_with_the_onnx_verifier(trained, fixture_engine) -> None:
    path, _, _ = trained
    fixture_engine.set_verifier(str(path))
    try:
        result = fixture_engine.generate("Write a haiku about rain.", SamplingParams(max_tokens=12),
                                         method="sprinter")
    finally:
        fixture_engine.set_verifier("confidence")
    assert len(result.token_ids) > 0


def test_verifier_for_another_pair_is_refused(trained, fixture_engine) -> None:
    path, _, _ = trained
    ver = OnnxVerifier(path)
    # same hidden size, other weights: the target passed as the draft
    with pytest.raises(VerifierError, match="trained for draft"):
        ver.check_pair(fixture_engine.target, fixture_engine.target)
    with pytest.raises(VerifierError):
        resolve_verifier(str(path), None, fixture_engine.target, fixture_engine.target)


def test_hidden_size_mismatch_is_refused(data_dir: Path, tmp_path: Path, trained, fixture_engine) -> None:
    _, result, _ = trained
    data, meta = load_data(data_dir)
    c = candidate("logreg-hidden")
    x = feature_matrix(data, c.layout)
    pipe = c.build(x.shape[1]).fit(x, labels(data, "greedy"))
    pair = json.loads(json.dumps(meta["pair"]))
    # claims a 576-d draft but the draft in use is the fixture draft: change its size instead
    path = export(pipe, tmp_path / "h.onnx", layout=c.layout, n_features=x.shape[1], pair=pair,
                  label_rule="greedy", default_threshold=0.5, presets={}, table=result.table,
                  metrics={}, tv_pq=0.1)
    ver = OnnxVerifier(path)

    class Bigger:
        n_embd = fixture_engine.draft.n_embd * 2

    with pytest.raises(VerifierError, match="n_embd"):
        ver.check_pair(Bigger(), fixture_engine.target)


def test_other_feature_layout_is_refused(data_dir: Path, tmp_path: Path, trained) -> None:
    _, result, _ = trained
    data, meta = load_data(data_dir)
    c = candidate("logreg-hidden")
    x = feature_matrix(data, c.layout)
    pipe = c.build(x.shape[1]).fit(x, labels(data, "greedy"))
    kwargs = dict(n_features=x.shape[1], pair=meta["pair"], label_rule="greedy", default_threshold=0.5,
                  presets={}, table=result.table, metrics={}, tv_pq=0.1)
    # the model reads the hidden state only, the file claims hidden + confidence
    with pytest.raises(VerifierError, match="layout"):
        OnnxVerifier(export(pipe, tmp_path / "a.onnx", layout=("hidden", "max_prob", "entropy"), **kwargs))
    with pytest.raises(VerifierError, match="unknown feature blocks"):
        OnnxVerifier(export(pipe, tmp_path / "b.onnx", layout=("hidden_layer_12",), **kwargs))
    ok = OnnxVerifier(export(pipe, tmp_path / "c.onnx", layout=("hidden",), **kwargs))
    with pytest.raises(VerifierError, match="expects features"):
        ok.check_layout(("max_prob", "entropy"))


def test_corrupt_or_missing_file_is_refused(trained, tmp_path: Path) -> None:
    path, _, _ = trained
    with pytest.raises(VerifierError, match="not found"):
        OnnxVerifier(tmp_path / "missing.onnx")
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(VerifierError, match="cannot load"):
        OnnxVerifier(bad)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not an onnx model at all")
    with pytest.raises(VerifierError):
        OnnxVerifier(junk)


def test_onnx_without_metadata_is_refused(data_dir: Path, tmp_path: Path) -> None:
    from sprinter_edge.training.export import to_onnx

    data, _ = load_data(data_dir)
    c = candidate("logreg-maxprob")
    x = feature_matrix(data, c.layout)
    pipe = c.build(1).fit(x, labels(data, "greedy"))
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(to_onnx(pipe, 1).SerializeToString())
    with pytest.raises(VerifierError, match="not a sprinter-edge verifier"):
        OnnxVerifier(plain)


def test_calibration_picks_the_lowest_threshold_within_the_fp_rate() -> None:
    scores = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    y = np.array([0, 0, 1, 0, 1])
    table = calibration_table(scores, y)
    # eta_FP <= 1/3: only the negative at 0.7 may pass -> flag everything below 0.7 -> t in (0.3, 0.7]
    assert threshold_for_max_fp(table, 1 / 3) == pytest.approx(0.32)
    assert threshold_for_max_fp(table, 0.0) == pytest.approx(0.72)
    assert threshold_for_max_fp(table, 1.0) == pytest.approx(0.02)
    rows = {r.threshold: r for r in table}
    assert rows[0.32].flag_rate == pytest.approx(0.4)
    assert rows[0.32].eta_fp == pytest.approx(1 / 3)
    etas = [r.eta_fp for r in table]
    assert etas == sorted(etas, reverse=True)
    with pytest.raises(VerifierError):
        threshold_for_max_fp(table, 1.5)


def test_verifier_level_calibration(trained) -> None:
    path, result, _ = trained
    ver = OnnxVerifier(path)
    for fp in (0.1, 0.3, 0.6):
        t = verifier_threshold_for_max_fp(ver, fp)
        assert t == threshold_for_max_fp(result.table, fp)
    with pytest.raises(VerifierError, match="no calibration table"):
        verifier_threshold_for_max_fp(Confidence(), 0.2)


def test_cli_calibrate(trained, capsys: pytest.CaptureFixture[str]) -> None:
    from sprinter_edge.cli import main

    path, result, _ = trained
    assert main(["verifier", "calibrate", str(path), "--max-fp-rate", "0.3"]) == 0
    out = capsys.readouterr().out
    assert f"threshold (eta_FP <= 0.3): {threshold_for_max_fp(result.table, 0.3):g}" in out
    assert "TV(p, p_sprinter) <= eta_FP * TV(p, q)" in out
    assert main(["verifier", "calibrate", str(path), "--preset", "quality", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["threshold"] == result.presets["quality"]
