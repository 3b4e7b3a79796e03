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
    CalibrationRow,
    calibration_table,
    drift_line,
    table_from_json,
    table_to_json,
    threshold_for_max_fp,
    with_greedy_drift,
)
from sprinter_edge.verifiers.loading import resolve_verifier
from sprinter_edge.verifiers.onnx import OnnxVerifier
from sprinter_edge.verifiers.operating_point import OperatingPoint
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


@pytest.mark.slow
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


def test_sprinter_generates_with_the_onnx_verifier(trained, fixture_engine, monkeypatch) -> None:
    """SPRINTER consults the ONNX verifier on every drafted token it judges: its scores, counted
    where the engine calls it, are the reply's kept tokens (at or above the threshold) and its
    flags (below)."""
    path, _, _ = trained
    fixture_engine.set_verifier(str(path))
    try:
        ver = fixture_engine.verification.verifier
        assert isinstance(ver, OnnxVerifier)
        # a model of the max probability alone decides outside a band around its cut without
        # running (the same decisions): off here, so every judged token is one ONNX score
        monkeypatch.setattr(ver, "max_prob_band", lambda threshold: None)
        scores: list[float] = []
        score = ver.score

        def counted(features: DraftFeatures) -> float:
            scores.append(float(score(features)))
            return scores[-1]

        monkeypatch.setattr(ver, "score", counted)
        result = fixture_engine.generate("Write a haiku about rain.", SamplingParams(max_tokens=12),
                                         method="sprinter")
    finally:
        fixture_engine.set_verifier("confidence")
    s, c = result.stats, result.stats.counters
    assert len(result.token_ids) > 0 and s.point.verifier == ver.name
    assert len(scores) > 0 and s.timings.verifier_seconds > 0
    assert sum(x >= s.point.threshold for x in scores) == c.kept, (scores, s.point.threshold, c)
    assert sum(x < s.point.threshold for x in scores) == c.flags, (scores, s.point.threshold, c)


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
        t = OperatingPoint(max_fp_rate=fp).resolve(ver)
        assert t == threshold_for_max_fp(result.table, fp)
    with pytest.raises(VerifierError, match="no calibration table"):
        OperatingPoint(max_fp_rate=0.2).resolve(Confidence())


def test_cli_calibrate(trained, capsys: pytest.CaptureFixture[str]) -> None:
    from sprinter_edge.cli import main

    path, result, _ = trained
    assert main(["verifier", "calibrate", str(path), "--max-fp-rate", "0.3"]) == 0
    out = capsys.readouterr().out
    assert f"threshold (eta_FP <= 0.3): {threshold_for_max_fp(result.table, 0.3):g}" in out
    assert "eta_FP * TV(p, q)" not in out and "TV bound" not in out
    row = next(r for r in result.table if r.threshold == threshold_for_max_fp(result.table, 0.3))
    assert f"greedy {row.drift_greedy:.4f}" in out and f"temperature 1 {row.drift_t1:.4f}" in out
    assert main(["verifier", "calibrate", str(path), "--preset", "quality", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["threshold"] == result.presets["quality"]


def test_calibration_drift_columns_known_values() -> None:
    scores = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    y = np.array([0, 0, 1, 0, 1])  # greedy label: 0 = the two models' argmax differ
    tv = np.array([0.4, 0.2, 0.1, 0.3, 0.05])  # TV(p, q) at temperature 1
    table = calibration_table(scores, y, argmax_differs=y == 0, tv=tv)
    rows = {r.threshold: r for r in table}
    # t = 0.32 passes tokens 2, 3, 4: one of them has differing argmax, out of 5 tokens
    assert rows[0.32].drift_greedy == pytest.approx(1 / 5)
    assert rows[0.32].drift_greedy == pytest.approx(rows[0.32].eta_fp * 3 / 5)  # eta_FP * P(differs)
    assert rows[0.32].drift_t1 == pytest.approx((0.1 + 0.3 + 0.05) / 5)
    # eta_FP = 0 at t = 0.72 (only label-1 token 4 passes), yet at temperature 1 it drifts
    assert rows[0.72].eta_fp == 0 and rows[0.72].drift_greedy == 0
    assert rows[0.72].drift_t1 == pytest.approx(0.05 / 5)
    # every token passed: the draft alone
    assert rows[0.02].drift_t1 == pytest.approx(tv.mean())
    # JSON round trip; a table without the columns (older files) loads with them None
    back = table_from_json(table_to_json(table))[15]
    assert (back.drift_greedy, back.drift_t1) == (pytest.approx(0.2), pytest.approx(0.09))
    bare = calibration_table(scores, y)
    assert "drift_t1" not in table_to_json(bare)[0]
    old = table_from_json([{"threshold": 0.5, "flag_rate": 0.2, "eta_fp": 0.3, "false_flag_rate": 0.1,
                            "accuracy": 0.8}])
    assert old[0].drift_greedy is None and old[0].drift_t1 is None
    assert "not in this table" in drift_line(old[0])
    # for a greedy-label table the greedy column follows from eta_FP and accuracy
    filled = {r.threshold: r for r in with_greedy_drift(table_from_json(table_to_json(bare)))}
    assert filled[0.32].drift_greedy == pytest.approx(1 / 5, abs=1e-5)
    line = drift_line(rows[0.32], 0.2)
    assert "greedy 0.2000" in line and "temperature 1 0.0900" in line
    with pytest.raises(VerifierError, match="malformed"):
        table_from_json([{"threshold": 0.5, "bogus": 1.0}])
    assert isinstance(old[0], CalibrationRow)


def test_trained_table_has_drift_columns(data_dir: Path, trained) -> None:
    path, result, _ = trained
    data, _ = load_data(data_dir)
    _, _, te = split_by_prompt(data["prompt_index"], (0.6, 0.2, 0.2), 0)
    differs = data["label_greedy"][te] == 0  # the collected token is the draft's argmax
    tv = data["tv"][te].astype(np.float64)
    assert result.tv_pq == pytest.approx(tv.mean())
    for r in result.table:
        passed = result.test_scores >= r.threshold
        assert r.drift_greedy == pytest.approx((passed & differs).mean())
        assert r.drift_t1 == pytest.approx((passed * tv).mean())
        assert r.drift_greedy == pytest.approx(r.eta_fp * differs.mean())
    loaded = OnnxVerifier(path).calibration
    assert [r.drift_t1 for r in loaded] == pytest.approx([r.drift_t1 for r in result.table], abs=1e-6)


def test_data_without_tv_trains_without_the_t1_column(data_dir: Path, tmp_path: Path) -> None:
    import shutil

    from sprinter_edge.training.train import table_markdown, train

    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(data_dir / "meta.json", old / "meta.json")
    for shard in sorted(data_dir.glob("shard-*.npz")):
        with np.load(shard) as z:
            np.savez_compressed(old / shard.name, **{k: z[k] for k in z.files if k != "tv"})
    data, _ = load_data(old)
    assert "tv" not in data
    result = train(data, TrainConfig(candidates=("logreg-maxprob",)))
    assert result.tv_pq is None
    assert all(r.drift_t1 is None and r.drift_greedy is not None for r in result.table)
    assert "T=1" not in table_markdown(result.table)


def test_shipped_verifier_table_loads_without_drift_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from sprinter_edge.catalog.registry import load_registry
    from sprinter_edge.cli import main

    path = load_registry().pair("default").verifier_path()
    if path is None or not Path(path).exists():
        pytest.fail("no shipped verifier for the default pair (models/verifiers/, in the repository)")
    ver = OnnxVerifier(path)
    assert ver.calibration and ver.label_rule == "greedy"
    filled = with_greedy_drift(ver.calibration)
    assert all(r.drift_greedy is not None for r in filled)
    assert main(["verifier", "calibrate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "drift from the target per token" in out and "TV bound" not in out


def test_shipped_verifier_knows_its_highest_score() -> None:
    """The max-prob verifier's scores lie in a narrow band: a threshold of 0.977 is above every
    score it gives (session 6 ran one by mistake: every token flagged)."""
    from sprinter_edge.catalog.registry import load_registry

    path = load_registry().pair("default").verifier_path()
    if path is None or not Path(path).exists():
        pytest.fail("no shipped verifier for the default pair (models/verifiers/, in the repository)")
    ver = OnnxVerifier(path)
    top = ver.highest_score()
    assert top is not None and 0.97 < top < 0.98
    assert float(ver.score_matrix(np.array([[1.0]]))[0]) == pytest.approx(top, abs=1e-6)
    assert float(ver.score_matrix(np.array([[0.9]]))[0]) < top


def test_a_monotone_verifier_decides_by_max_prob_outside_its_band() -> None:
    """The shipped verifier reads the max probability alone and rises along it: outside a band
    of 2e-5 around its cut the max probability decides, and those decisions are the model's
    (run one row at a time, as the decoder runs it)."""
    from sprinter_edge.catalog.registry import load_registry

    path = load_registry().pair("default").verifier_path()
    if path is None or not Path(path).exists():
        pytest.fail("no shipped verifier for the default pair (models/verifiers/, in the repository)")
    ver = OnnxVerifier(path)
    rng = np.random.default_rng(0)
    for threshold in (0.9, 0.9766, ver.default_threshold):
        band = ver.max_prob_band(threshold)
        assert band is not None and 0.0 < band[0] < band[1] < 1.0 and band[1] - band[0] < 1e-4
        cut = (band[0] + band[1]) / 2
        m = np.concatenate([rng.uniform(0.0, 1.0, 2_000), cut + np.linspace(-2e-5, 2e-5, 401)])
        outside = (m < band[0]) | (m >= band[1])
        by_model = np.array([ver.score_matrix(np.array([[x]]))[0] >= threshold for x in m])
        assert np.array_equal(by_model[outside], m[outside] >= band[1])
        assert outside.sum() > 2_000 and (~outside).sum() > 100
    assert ver.max_prob_band(ver.highest_score() + 1e-4) == (2.0, 2.0)  # nothing passes


def test_a_verifier_that_reads_the_hidden_state_has_no_max_prob_band() -> None:
    from sprinter_edge.catalog.registry import load_registry

    path = load_registry().pair("default").verifier_path()
    if path is None or not Path(path).exists():
        pytest.fail("no shipped verifier for the default pair (models/verifiers/, in the repository)")
    hidden = Path(path).with_name(Path(path).stem + "-hidden.onnx")
    if not hidden.exists():
        pytest.fail(f"no hidden-state variant of the shipped verifier ({hidden.name})")
    assert OnnxVerifier(hidden).max_prob_band(0.9) is None  # it reads the hidden state too


def test_an_unreachable_threshold_is_warned_about(fixture_engine, caplog: pytest.LogCaptureFixture) -> None:
    class Capped(Confidence):
        def score(self, features: DraftFeatures) -> float:
            return min(features.max_prob, 0.5)

        def highest_score(self) -> float | None:
            return 0.5

    with caplog.at_level("WARNING", logger="sprinter_edge.api"):
        for _ in range(2):
            result = fixture_engine.generate("Write a haiku about rain.", SamplingParams(max_tokens=6),
                                             method="sprinter", verifier=Capped(),
                                             operating_point=OperatingPoint(threshold=0.6))
    warned = [r for r in caplog.records if "above the highest score" in r.getMessage()]
    assert len(warned) == 1 and result.stats.counters.kept == 0  # warned once; nothing passes
