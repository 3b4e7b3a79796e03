"""The verifier study on synthetic data: split, the runtime replay, matched-cost comparison."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from sprinter_edge.errors import SprinterError
from sprinter_edge.training import study
from sprinter_edge.training.study import (
    StudyCandidate,
    StudyConfig,
    compare,
    presets_by_domain,
    report_markdown,
    run_study,
    simulate,
    split_by_group,
    table_cost,
)
from sprinter_edge.training.study.fitting import _training_rows

HIDDEN = 16
DIRECTION = 5  # the hidden column the label depends on beyond max_prob


def _synthetic(n_groups: int = 50, prompts_per_group: int = 2, tokens: int = 30, hidden_weight: float = 2.5,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Two domains, two temperatures; acceptance depends on max_prob and, with `hidden_weight`
    != 0, on one hidden direction max_prob does not see."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list[np.ndarray]] = {}
    prompt = 0
    for g in range(n_groups):
        domain = g % 2
        for _ in range(prompts_per_group):
            for temp in (0.0, 0.7):
                h = rng.normal(size=(tokens, HIDDEN)).astype(np.float32)
                z = rng.normal(1.0, 1.2, size=tokens)
                max_prob = 1 / (1 + np.exp(-z))
                logit = 0.3 + 1.2 * z + hidden_weight * h[:, DIRECTION]
                p_acc = 1 / (1 + np.exp(-logit))
                if temp == 0:
                    label = (rng.random(tokens) < p_acc).astype(np.uint8)
                    accept = label.astype(np.float32)
                else:
                    accept = np.minimum(1.0, 1.15 * p_acc).astype(np.float32)  # some exactly 1
                    label = (rng.random(tokens) < p_acc).astype(np.uint8)
                block = {
                    "hidden": h.astype(np.float16),
                    "max_prob": max_prob, "entropy": -np.log(max_prob) + rng.normal(0, 0.1, tokens),
                    "margin": max_prob - rng.uniform(0, 1 - max_prob),
                    "logq_x": np.log(max_prob) / max(temp, 1.0),
                    "q_ratio": np.ones(tokens), "run_position": np.arange(tokens) % 5,
                    "since_flag": np.arange(tokens) % 7, "last_accepted": rng.integers(0, 2, tokens),
                    "last_rejected": rng.integers(0, 2, tokens), "output_position": np.arange(tokens),
                    "token": rng.integers(0, 1000, tokens), "temperature": np.full(tokens, temp),
                    "accept_prob": accept, "label_greedy": label, "label_paper": label,
                    "tv": 1 - accept, "scored": (rng.random(tokens) > 0.03).astype(np.uint8),
                    "prompt_index": np.full(tokens, prompt), "group": np.full(tokens, g),
                    "domain": np.full(tokens, domain),
                }
                for k, v in block.items():
                    cols.setdefault(k, []).append(np.asarray(v))
            prompt += 1
    data_tokens = np.concatenate(cols["token"])
    cols["embedding"] = [rng.normal(size=(1000, 8))[data_tokens]]  # a fixed row per token id
    dtypes = {"token": np.int32, "prompt_index": np.int32, "group": np.int32, "domain": np.uint8,
              "label_greedy": np.uint8, "label_paper": np.uint8, "scored": np.uint8, "hidden": np.float16}
    data = {k: np.concatenate(v).astype(dtypes.get(k, np.float32)) for k, v in cols.items()}
    perm = rng.permutation(len(data["group"]))  # storage order must not matter: the replay sorts
    return {k: v[perm] for k, v in data.items()}


def _maxprob_copy() -> StudyCandidate:
    """The confidence rule again under another name (a differently regularised logistic map of
    max_prob: the same ranking), so its matched reduction must be ~0."""
    return StudyCandidate("confidence-copy", ("max_prob",),
                          lambda d, s: Pipeline([("clf", LogisticRegression(C=0.05))]),
                          "the confidence rule again")


def _cfg(**kw: object) -> StudyConfig:
    # reference thresholds the synthetic confidence rule reaches (a strong hidden signal keeps
    # its calibrated score low)
    ref = {"quality": 0.8, "balanced": 0.7, "fast": 0.55}
    return StudyConfig(**{"candidates": ("logreg-hidden-scalars", _maxprob_copy()), "n_boot": 400,
                          "n_threads": 1, "reference_thresholds": ref, **kw})


@pytest.fixture(scope="module")
def signal_report() -> dict:
    return run_study(_synthetic(n_groups=60, hidden_weight=3.0), _cfg())


@pytest.fixture(scope="module")
def null_report() -> dict:
    return run_study(_synthetic(n_groups=60, hidden_weight=0.0, seed=1), _cfg())


# --------------------------------------------------------------------------- split


def test_split_keeps_groups_whole_and_is_stratified() -> None:
    rng = np.random.default_rng(3)
    group = np.repeat(np.arange(40), 25)
    domain = (np.arange(40) % 4 == 0).astype(np.uint8)[group]  # 10 chat groups, 30 code groups
    # group 1 (code) has a few chat rows: it goes with its majority, code
    domain[group == 1] = np.where(rng.random(25) < 0.2, 1, 0)
    tr, ca, te = split_by_group(group, domain, (0.6, 0.2, 0.2), seed=0)
    assert np.all(tr.astype(int) + ca.astype(int) + te.astype(int) == 1)
    for g in np.unique(group):
        parts = {k for k, m in enumerate((tr, ca, te)) if m[group == g].any()}
        assert len(parts) == 1, f"group {g} split over parts {parts}"
    chat_groups = np.arange(40)[np.arange(40) % 4 == 0]
    for m, expected in ((tr, 6), (ca, 2), (te, 2)):
        assert len(np.intersect1d(np.unique(group[m]), chat_groups)) == expected
        assert len(np.setdiff1d(np.unique(group[m]), chat_groups)) == {6: 18, 2: 6}[expected]
    # another seed: another split, still whole groups
    tr2, _, _ = split_by_group(group, domain, seed=1)
    assert not np.array_equal(tr, tr2)


def test_split_refuses_too_few_groups() -> None:
    group = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    domain = np.array([0, 0, 0, 0, 0, 0, 1, 1])  # chat has one group
    with pytest.raises(SprinterError, match="too few"):
        split_by_group(group, domain)


# --------------------------------------------------------------------------- cost, replay


def test_cost_table_interpolates_and_extrapolates() -> None:
    cost = table_cost()
    assert cost(1) == 68 and cost(2) == 108 and cost(24) == 866
    assert cost(3) == pytest.approx(136) and cost(12) == pytest.approx(430.5)
    assert cost(32) == pytest.approx(866 + 8 * (866 - 493) / 8)
    assert cost(0) == pytest.approx(28)


def _hand_data() -> dict[str, np.ndarray]:
    # trajectory A (prompt 0): 6 tokens; trajectory B (prompt 1): 2 tokens, stored first and reversed
    a = {"score": [0.9, 0.9, 0.9, 0.2, 0.9, 0.9], "scored": [1, 1, 1, 1, 0, 1],
         "accept_prob": [0.5, 1.0, 0.8, 0.3, 0.6, 0.9]}
    n = 8
    return {
        "prompt_index": np.array([1, 1, 0, 0, 0, 0, 0, 0], np.int32),
        "temperature": np.zeros(n, np.float32),
        "output_position": np.array([1, 0, 0, 1, 2, 3, 4, 5], np.float32),
        "scored": np.array([1, 1, *a["scored"]], np.uint8),
        "accept_prob": np.array([0.5, 0.5, *a["accept_prob"]], np.float32),
        "group": np.array([1, 1, 0, 0, 0, 0, 0, 0], np.int32),
        "domain": np.zeros(n, np.uint8),
        "_score": np.array([0.9, 0.9, *a["score"]]),
    }


def test_simulate_hand_trajectory() -> None:
    d = _hand_data()
    traj_a = d["prompt_index"] == 0
    # cap 3: keep, keep, cap call (r=2: 4 tokens), flag (r=0: 2), unscored (2), keep
    out = simulate(d["_score"], d, traj_a, threshold=0.5, cost=lambda k: 10.0 * k, cap=3)
    assert out["tokens"] == 6 and out["kept"] == 3 and out["target_calls"] == 3
    assert out["target_ms"] == pytest.approx(40 + 20 + 20)
    assert out["false_passes"] == pytest.approx(0.5 + 0.0 + 0.1)
    assert out["eta_fp"] == pytest.approx(0.6 / (0.5 + 0 + 0.2 + 0.7 + 0.1))
    assert out["target_ms_per_token"] == pytest.approx(80 / 6)
    # without the cap the third token is kept, and the flag then carries 3 pending tokens (5)
    out = simulate(d["_score"], d, traj_a, threshold=0.5, cost=lambda k: 10.0 * k, cap=None)
    assert out["kept"] == 4 and out["target_ms"] == pytest.approx(50 + 20)
    # both trajectories: B starts again at r = 0 (its two tokens are kept: no cap call)
    both = simulate(d["_score"], d, np.ones(8, bool), threshold=0.5, cost=lambda k: 10.0 * k, cap=3)
    assert both["kept"] == 5 and both["target_calls"] == 3 and both["target_ms"] == pytest.approx(80)
    assert both["false_passes"] == pytest.approx(0.6 + 0.5 + 0.5)


def _reference_loop(s: np.ndarray, d: dict[str, np.ndarray], thr: float, cost: Callable[[float], float],
                    cap: int) -> tuple[float, float, int]:
    """Sprinter.run's loop, literally, one trajectory at a time."""
    ms = fp = 0.0
    calls = 0
    for key in sorted(set(zip(d["prompt_index"].tolist(), d["temperature"].tolist(), strict=True))):
        rows = np.flatnonzero((d["prompt_index"] == key[0]) & (d["temperature"] == key[1]))
        rows = rows[np.argsort(d["output_position"][rows])]
        r = 0
        for i in rows:
            if r + 1 >= cap or not d["scored"][i] or not s[i] >= thr:
                ms += cost(r + 2)
                calls += 1
                r = 0
            else:
                r += 1
                fp += 1 - d["accept_prob"][i]
    return ms, fp, calls


@pytest.mark.parametrize("cap", [1, 2, 4, 16])
def test_simulate_matches_the_runtime_loop(cap: int) -> None:
    d = _synthetic(n_groups=6, tokens=40, seed=7)
    s = d["max_prob"].astype(np.float64)
    for thr in (0.2, 0.5, 0.8):
        ms, fp, calls = _reference_loop(s, d, thr, table_cost(), cap)
        out = simulate(s, d, np.ones(len(s), bool), thr, cap=cap)
        assert out["target_ms"] == pytest.approx(ms) and out["false_passes"] == pytest.approx(fp)
        assert out["target_calls"] == calls


# --------------------------------------------------------------------------- comparison


def test_compare_matches_cost_and_pairs_the_bootstrap() -> None:
    d = _synthetic(n_groups=20, seed=2)
    s_conf = d["max_prob"].astype(np.float64)
    z = np.log(s_conf / (1 - s_conf))
    scores = {"confidence": s_conf, "same-ranking": s_conf ** 3,  # same ranking, other scale
              "oracle": 1.2 * z + 2.5 * d["hidden"][:, DIRECTION].astype(np.float64)}  # the true logit
    test = d["temperature"] == 0
    out = compare(scores, d, test, reference_thresholds={"quality": 0.85, "fast": 0.5}, n_boot=300)
    for dom in ("code", "chat", "all"):
        for op in out[dom]["operating_points"].values():
            same, oracle = op["candidates"]["same-ranking"], op["candidates"]["oracle"]
            assert same["reduction"] == pytest.approx(0) and same["reduction_ci"] == pytest.approx([0, 0])
            assert oracle["cost_ratio"] == pytest.approx(1, abs=0.03)
            assert oracle["reduction"] > 0.2 and oracle["reduction_ci"][0] > 0


def test_hidden_model_wins_on_hidden_signal(signal_report: dict) -> None:
    dec = signal_report["decision"]
    assert "logreg-hidden-scalars" in dec["wins_all_regimes"]
    assert "confidence-copy" not in dec["wins_all_regimes"]
    assert dec["best_hidden"] == "logreg-hidden-scalars"
    for regime, by_dom in signal_report["comparison"].items():
        for dom, d in by_dom.items():
            for op in d["operating_points"].values():
                assert not op["reference"]["degenerate"]
                hid, copy = op["candidates"]["logreg-hidden-scalars"], op["candidates"]["confidence-copy"]
                assert hid["reduction_ci"][0] > 0, (regime, dom)
                assert copy["reduction_ci"][0] <= 0 <= copy["reduction_ci"][1], (regime, dom)
                for c in (hid, copy):  # matching held
                    assert c["cost_ratio"] == pytest.approx(1, abs=0.05), (regime, dom, c)


def test_no_win_without_hidden_signal(null_report: dict) -> None:
    assert "logreg-hidden-scalars" not in null_report["decision"]["wins_all_regimes"]
    assert null_report["decision"]["best"] is None


def test_report_is_json_and_renders(signal_report: dict) -> None:
    json.dumps(signal_report, allow_nan=False)
    assert set(signal_report) >= {"config", "split", "regimes", "candidates", "comparison", "presets",
                                  "decision", "skipped", "seconds"}
    split = signal_report["split"]
    assert split["test"]["code"]["groups"] == 6 and split["test"]["chat"]["groups"] == 6
    for regime in ("greedy", "sampled"):
        r = signal_report["candidates"]["logreg-hidden-scalars"]["regimes"][regime]
        assert r["fit_seconds"] > 0 and r["score_us"]["batch_us_per_row"] > 0
        assert r["auc"]["all"] > signal_report["candidates"]["confidence"]["regimes"][regime]["auc"]["all"]
    md = report_markdown(signal_report)
    assert "logreg-hidden-scalars" in md and "## Decision" in md and "quality" in md


def test_presets_hold_on_test(signal_report: dict) -> None:
    p = signal_report["presets"]["greedy"]["logreg-hidden-scalars"]["all"]
    assert p["quality"]["threshold"] >= p["balanced"]["threshold"] >= p["fast"]["threshold"]
    assert p["quality"]["eta_fp_calib"] <= p["quality"]["target"]
    lo, hi = p["balanced"]["eta_fp_test_ci"]
    assert lo <= p["balanced"]["eta_fp_test"] <= hi


def test_presets_by_domain_picks_the_lowest_passing_threshold() -> None:
    d = _synthetic(n_groups=10, seed=4)
    s = d["max_prob"].astype(np.float64)
    cal = d["temperature"] == 0
    grid = [0.1, 0.3, 0.5, 0.7, 0.9, 0.99]
    out = presets_by_domain(s, d, cal, {"loose": 1.0, "tight": 0.0}, thresholds=grid)
    assert out["all"]["loose"]["threshold"] == 0.1
    etas = [simulate(s, d, cal, t)["eta_fp"] for t in grid]
    tight = out["all"]["tight"]["threshold"]
    assert tight is None or etas[grid.index(tight)] == 0


def test_soft_target_duplicates_fractional_rows() -> None:
    d = {"accept_prob": np.array([1.0, 0.0, 0.25], np.float32), "label_greedy": np.array([1, 0, 0])}
    idx, y, w = _training_rows(d, np.arange(3), "sampled", weighted=True, seed=0)
    assert idx.tolist() == [0, 1, 2, 2] and y.tolist() == [1, 0, 1, 0]
    assert w.tolist() == pytest.approx([1, 1, 0.25, 0.75])
    idx, y, w = _training_rows(d, np.arange(3), "sampled", weighted=False, seed=0)
    assert w is None and y[:2].tolist() == [1, 0]


def test_fit_final_returns_a_scoring_pipeline() -> None:
    d = _synthetic(n_groups=12, tokens=20, seed=5)
    masks = split_by_group(d["group"], d["domain"])
    with threadpool_limits(1):
        est = study.fit_final(d, "logreg-hidden-scalars", masks, "sampled")
    x = study.matrix_of(d, ("hidden", *study.SCALARS))[:5]
    assert x.shape == (5, HIDDEN + len(study.SCALARS))
    p = est.predict_proba(x)[:, 1]
    assert np.all((p >= 0) & (p <= 1))
    assert isinstance(est, Pipeline) and isinstance(est.steps[0][1], StandardScaler)


@pytest.mark.slow
def test_every_candidate_fits_and_the_time_budget_skips() -> None:
    d = _synthetic(n_groups=24, tokens=20, seed=6)
    rep = run_study(d, _cfg(candidates=None, n_boot=100))
    assert list(rep["candidates"]) == [c.name for c in study.CANDIDATES] and not rep["skipped"]
    for name, c in rep["candidates"].items():
        assert c["exportable"] == (name not in ("hgb-proj-scalars", "logreg-token-scalars",
                                                "logreg-embed-scalars", "logreg-hidden-embed-scalars"))
        for regime, r in c["regimes"].items():
            assert 0.5 < r["auc"]["all"] <= 1, (name, regime)
            if regime == "sampled":  # soft target through sample weights
                assert r["soft_target"] == "weighted duplicates" and r["fit_rows"] > r["train_rows"]
    lean = run_study(d, _cfg(candidates=None, n_boot=100, time_budget_s=0.0))
    assert list(lean["candidates"]) == ["confidence"] and len(lean["skipped"]) == len(study.CANDIDATES) - 1
    assert lean["decision"]["best"] is None


def test_candidates_without_their_column_are_skipped_with_the_reason() -> None:
    d = _synthetic(n_groups=12, tokens=10, seed=7)
    del d["embedding"]
    rep = run_study(d, _cfg(candidates=("logreg-embed-scalars", "logreg-scalars"), n_boot=50))
    assert list(rep["candidates"]) == ["confidence", "logreg-scalars"]
    assert rep["skipped"] == ["logreg-embed-scalars"]
    assert rep["skipped_why"]["logreg-embed-scalars"] == "no embedding in the data"
    assert "logreg-embed-scalars (no embedding in the data)" in study.report_markdown(rep)
