"""On-policy verifier data (training/onpolicy.py) on the fixture pair.

The collector re-implements SPRINTER's loop to see every drafted token with the target's
opinion of it; these tests hold it to the decoder: the same trajectory, the same features
the verifier was shown, and labels that follow from the target's logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sprinter_edge.decoding import Origin, SamplingParams
from sprinter_edge.errors import SprinterError
from sprinter_edge.numerics import softmax
from sprinter_edge.training import onpolicy
from sprinter_edge.training.collect import CollectConfig, collect, load_data
from sprinter_edge.training.corpus import Corpus, CorpusPrompt, domain_of, prompt_groups
from sprinter_edge.verifiers.base import DraftFeatures, Verifier
from sprinter_edge.verifiers.operating_point import OperatingPoint
from sprinter_edge.verifiers.simple import Confidence

THRESHOLD = 0.35
CAP = 6


class Recording(Verifier):
    """The confidence rule, remembering what it was shown (hidden states on, as collected)."""

    name = "recording"
    needs_hidden = True

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []
        self.rule = Confidence()

    def score(self, features: DraftFeatures) -> float:
        self.seen.append({"token": features.token, **{b: features.value(b) for b in onpolicy.SCALARS}})
        return self.rule.score(features)


def _decode(engine, prompt: list[int], params: SamplingParams) -> tuple[list[int], list[dict]]:
    rec = Recording()
    engine.set_verifier(rec)
    try:
        res = engine.generate(prompt, params, method="sprinter",
                              operating_point=OperatingPoint(threshold=THRESHOLD))
    finally:
        engine.set_verifier("confidence")
    return res.token_ids, rec.seen


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_trajectory_is_the_decoders(fixture_engine, temperature: float) -> None:
    prompt = fixture_engine.encode("List three colours and say why you like them.")
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=11)
    engine_cap = fixture_engine.settings.run_cap
    fixture_engine.settings.run_cap = CAP
    try:
        tokens, seen = _decode(fixture_engine, prompt, params)
    finally:
        fixture_engine.settings.run_cap = engine_cap
    rows = onpolicy.trajectory(fixture_engine.draft, fixture_engine.target, prompt, params,
                               onpolicy.Behaviour(Confidence(), THRESHOLD, CAP), 40)
    scored = [r for r in rows if r["scored"]]
    # the verifier was asked about the same tokens, shown the same features
    assert [r["token"] for r in scored] == [s["token"] for s in seen]
    for r, s in zip(scored, seen, strict=True):
        for name in onpolicy.SCALARS:
            assert r[name] == pytest.approx(s[name], rel=1e-6, abs=1e-9), name
    # and every kept token is in the decoder's output, in order
    kept = [r["token"] for r in rows if r["passed"]]
    it = iter(tokens)
    assert all(any(t == u for u in it) for t in kept)
    assert any(r["passed"] for r in rows) and any(r["scored"] and not r["passed"] for r in rows)
    assert any(not r["scored"] for r in rows) or len(rows) < CAP


def test_labels_follow_from_the_target(fixture_engine) -> None:
    draft, target = fixture_engine.draft, fixture_engine.target
    prompt = fixture_engine.encode("Write a short poem about the sea.")
    params = SamplingParams(temperature=0.8, seed=3)
    rows = onpolicy.trajectory(draft, target, prompt, params,
                               onpolicy.Behaviour(Confidence(), THRESHOLD, CAP), 24)
    assert len(rows) >= 10
    first = rows[0]
    # the first drafted token: its target row is the prompt's last position
    p_logits = target.sync(prompt, n_logits=1).logits[0]
    q_logits = draft.sync(prompt, n_logits=1).logits[0]
    p, q = softmax(p_logits / 0.8), softmax(q_logits / 0.8)
    x = first["token"]
    assert first["target_token"] == int(np.argmax(p_logits))
    assert first["accept_prob"] == pytest.approx(min(1.0, p[x] / q[x]), rel=1e-4)
    assert first["tv"] == pytest.approx(0.5 * np.abs(p - q).sum(), rel=1e-4)
    assert first["label_paper"] == float(q[x] <= p[x])
    assert first["run_position"] == 0 and first["last_accepted"] == 0 and first["output_position"] == 0
    for r in rows:
        assert 0.0 <= r["accept_prob"] <= 1.0 and 0.0 <= r["tv"] <= 1.0
    greedy = onpolicy.trajectory(draft, target, prompt, SamplingParams(max_tokens=24),
                                 onpolicy.Behaviour(Confidence(), THRESHOLD, CAP), 24)
    for r in greedy:
        assert r["accept_prob"] == r["label_greedy"] == float(r["token"] == r["target_token"])
        assert r["tv"] == 1.0 - r["label_greedy"]


def test_on_policy_collection_resumes_and_loads(fixture_engine, tmp_path: Path) -> None:
    prompts = tuple(CorpusPrompt(f"t{i}", "code_write" if i % 2 else "chat", "",
                                 text) for i, text in enumerate((
                                     "Write a function that adds two numbers, in Python.",
                                     "Write a function that adds two numbers, in Go.",
                                     "Why is the sky blue?")))
    corpus = Corpus("tiny", prompts)
    cfg = CollectConfig(max_new_tokens=12, shard_size=2, policy="sprinter", temperatures=(0.0, 0.7),
                        run_cap=CAP)
    behaviour = onpolicy.Behaviour(Confidence(), THRESHOLD, CAP)
    s1 = collect(fixture_engine.draft, fixture_engine.target, corpus, tmp_path, cfg,
                 behaviour=behaviour, progress=False)
    assert s1.shards_written == 2
    data, meta = load_data(tmp_path)
    assert meta["format"] == "sprinter-edge-verifier-data-v2"
    assert set(data) == set(onpolicy.FIELDS)
    assert set(np.unique(data["temperature"])) == {0.0, np.float32(0.7)}
    groups = prompt_groups(prompts)
    assert groups[0] == groups[1] != groups[2]  # the same task in two languages: one group
    for i, p in enumerate(prompts):
        m = data["prompt_index"] == i
        assert set(data["group"][m]) == {groups[i]}
        assert set(data["domain"][m]) == {onpolicy.DOMAIN_CODES[domain_of(p)]}
    assert data["hidden"].shape == (len(data["token"]), fixture_engine.draft.n_embd)
    s2 = collect(fixture_engine.draft, fixture_engine.target, corpus, tmp_path, cfg,
                 behaviour=behaviour, progress=False)
    assert s2.shards_written == 0 and s2.shards_skipped == 2
    # resuming with another behaviour (here its threshold) would mix two policies: refused
    with pytest.raises(SprinterError, match="another behaviour"):
        collect(fixture_engine.draft, fixture_engine.target, corpus, tmp_path, cfg,
                behaviour=onpolicy.Behaviour(Confidence(), THRESHOLD + 0.1, CAP), progress=False)
    assert meta["behaviour"] == {"verifier": "confidence", "digest": None, "threshold": THRESHOLD,
                                 "run_cap": CAP}
    with pytest.raises(Exception, match="behaviour"):
        collect(fixture_engine.draft, fixture_engine.target, corpus, tmp_path / "x", cfg, progress=False)


def test_sprinter_shows_the_run_history() -> None:
    # unit-level: the history features are plain numbers a verifier can read
    f = DraftFeatures(hidden=None, logits=np.array([2.0, 1.0, 0.0], np.float32), token=1,
                      run_position=3, output_position=9, temperature=0.5, since_flag=4, last_outcome=2)
    assert f.value("last_rejected") == 1.0 and f.value("last_accepted") == 0.0
    assert f.value("since_flag") == 4.0 and f.value("output_position") == 9.0
    q = softmax(np.array([2.0, 1.0, 0.0]) / 0.5)
    assert f.value("logq_x") == pytest.approx(np.log(q[1]), rel=1e-5)
    assert f.value("q_ratio") == pytest.approx(q[1] / q[0], rel=1e-5)
    p1 = softmax(np.array([2.0, 1.0, 0.0]))
    assert f.value("margin") == pytest.approx(p1[0] - p1[1], rel=1e-5)
    assert f.max_prob == pytest.approx(p1[0], rel=1e-6)
    assert Origin.KEPT  # the decoder's origins stay importable from here


@pytest.mark.slow
def test_cli_collects_on_policy_and_studies(fixture_target_path: Path, fixture_draft_path: Path,
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from sprinter_edge.cli import main

    lines = [{"id": f"c{i}", "category": "code_write", "prompt": f"Write a function that {task}."}
             for i, task in enumerate(("reverses a string", "sums a list", "finds the maximum",
                                       "counts vowels", "checks for a palindrome", "sorts words"))]
    lines += [{"id": f"h{i}", "category": "chat", "prompt": q} for i, q in enumerate((
        "Why is the sky blue?", "Name three rivers.", "What is rain?", "Describe a cat.",
        "Tell me about the moon.", "How do birds fly?"))]
    corpus = tmp_path / "prompts.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in lines))
    models = ["--draft", str(fixture_draft_path), "--target", str(fixture_target_path), "--threads", "1"]
    data = tmp_path / "data"
    assert main(["verifier", "collect", "--data", str(data), "--prompts", str(corpus), "--policy",
                 "sprinter", "--temperatures", "0,0.8", "--max-new-tokens", "10", "--no-progress",
                 *models]) == 0
    assert "collected" in capsys.readouterr().out
    out = tmp_path / "study.json"
    assert main(["verifier", "study", "--data", str(data), "--out", str(out), "--boot", "50",
                 "--candidates", "confidence,logreg-scalars,logreg-embed-scalars", "--costs", "machine",
                 *models]) == 0
    report = json.loads(out.read_text())
    assert set(report["comparison"]) == {"greedy", "sampled"}
    assert {"logreg-scalars", "logreg-embed-scalars"} <= set(report["candidates"])  # rows from the GGUF
    assert out.with_suffix(".md").read_text().startswith("## Split")
    # ship the calibrated confidence rule with presets per regime and domain; the engine uses them
    onnx = tmp_path / "shipped.onnx"
    assert main(["verifier", "study", "--data", str(data), "--out", str(tmp_path / "s2.json"), "--boot", "20",
                 "--candidates", "confidence", "--costs", "reference", "--ship", "confidence",
                 "--export", str(onnx), *models]) == 0
    from sprinter_edge import Engine, Hardware
    from sprinter_edge.verifiers.onnx import OnnxVerifier

    ver = OnnxVerifier(onnx)
    assert set(ver.domain_presets) <= {"greedy", "sampled"} and ver.domain_presets
    regime = next(iter(ver.domain_presets))
    for dom, pts in ver.domain_presets[regime].items():
        for preset, t in pts.items():
            assert ver.threshold_for(preset, dom, regime) == t
    assert ver.threshold_for("balanced") == ver.presets["balanced"]
    with Engine(fixture_target_path, fixture_draft_path, method="sprinter", verifier=str(onnx),
                hardware=Hardware(n_ctx=512, n_threads=1)) as engine:
        res = engine.generate("Write a Python function that reverses a string.",
                              SamplingParams(max_tokens=6))
        assert res.stats.point.domain == "code"
        res = engine.generate("Why is the sky blue?", SamplingParams(max_tokens=6))
        assert res.stats.point.domain == "chat"
    # draft-greedy data cannot be studied: a clear error, exit 1
    greedy_dir = tmp_path / "greedy"
    assert main(["verifier", "collect", "--data", str(greedy_dir), "--prompts", str(corpus), "--limit", "3",
                 "--max-new-tokens", "4", "--no-progress", *models]) == 0
    assert main(["verifier", "study", "--data", str(greedy_dir), "--costs", "reference", *models]) != 0
    assert "on-policy" in capsys.readouterr().err


def test_hidden_option_of_the_default_pair() -> None:
    from sprinter_edge.catalog.registry import load_registry
    from sprinter_edge.errors import VerifierError
    from sprinter_edge.verifiers.loading import resolve_verifier

    ver = resolve_verifier("hidden", load_registry().pair("default"), None, None)
    assert ver.needs_hidden and "hidden" in ver.layout and ver.domain_presets  # type: ignore[attr-defined]
    with pytest.raises(VerifierError, match="no hidden-state verifier"):
        resolve_verifier("hidden", load_registry().pair("qwen2.5-coder-0.5b-q4km-1.5b"), None, None)


def test_presets_per_domain_and_regime() -> None:
    from sprinter_edge.prompting import prompt_domain

    class Ver(Confidence):
        presets = {"quality": 0.9, "balanced": 0.7, "fast": 0.5}  # noqa: RUF012
        domain_presets = {"greedy": {"code": {"balanced": 0.8, "quality": 0.95}},  # noqa: RUF012
                          "sampled": {"chat": {"balanced": 0.6}}}

    v = Ver()
    assert OperatingPoint(preset="balanced").resolve(v, "code", "greedy") == 0.8
    assert OperatingPoint(preset="fast").resolve(v, "code", "greedy") == 0.5  # not per domain: global
    assert OperatingPoint(preset="balanced").resolve(v, "chat", "greedy") == 0.7
    assert OperatingPoint(preset="balanced").resolve(v, "chat", "sampled") == 0.6
    assert OperatingPoint().resolve(v, "code", "greedy") == 0.8  # the default point is balanced
    assert OperatingPoint().resolve(v) == v.default_threshold
    assert OperatingPoint(threshold=0.33).resolve(v, "code", "greedy") == 0.33
    assert prompt_domain("Write a Go function that reverses a slice.") == "code"
    assert prompt_domain("Explain what `git rebase -i` does.") == "code"
    assert prompt_domain("Give me three tips for a good night's sleep.") == "chat"
    assert prompt_domain([{"role": "system", "content": "You write python code."},
                          {"role": "user", "content": "Tell me a joke."}]) == "chat"


@pytest.mark.slow
def test_embedding_rows_are_the_drafts_own(fixture_engine) -> None:
    """The rows read from the GGUF are the ones llama.cpp multiplies: the fixture draft ties its
    output head to the token embeddings, so logits == final hidden state . row."""
    from sprinter_edge.training.embeddings import token_embedding_rows

    draft = fixture_engine.draft
    draft.reset()
    out = draft.eval(draft.tokenize("def add(a, b):\n    return"), hidden=True)
    logits, hidden = out.logits[-1], out.hidden[-1]
    ids = np.argsort(logits)[::-1][:50]
    ids = np.concatenate([ids, np.arange(0, draft.n_vocab, 997)])
    rows = token_embedding_rows(draft.path, ids)
    assert rows.shape == (len(ids), draft.n_embd) and rows.dtype == np.float32
    np.testing.assert_allclose(rows @ hidden, logits[ids], rtol=0, atol=0.05 * np.abs(logits[ids]).max())
    assert np.corrcoef(rows @ hidden, logits[ids])[0, 1] > 0.999
    with pytest.raises(SprinterError, match="outside the vocabulary"):
        token_embedding_rows(draft.path, np.array([draft.n_vocab]))
