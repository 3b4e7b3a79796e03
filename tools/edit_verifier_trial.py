"""Can a verifier catch the edit? Copy features, an edit-domain threshold and the hidden state
trained on edit trajectories, each judged on held-out tasks (issue 17, item 3).

For each edit task's `ar` reply in a bench.json the draft reads the reply teacher-forced (hidden
states on) and every reply position gets a label (the draft's greedy token is not the
target's: passing it changes the reply), the pair's verifiers' scores (logits, hidden) and copy
features from the lookup proposer's own matcher: a copy is on offer, the draft's token is that
copy, the match length, the copied run so far, the share of departures from the copy so far.
Along ar's own reply the draft sees what greedy SPRINTER's draft sees until the first false
pass, so a task's reply is reproduced exactly iff none of its labelled positions passes: that
is the task-level figure here (an upper bound on what a scorer keeps; a changed reply may still
pass its checks, rarely on edits, see results/bench-results-edits.json).

Scorers, judged by 2-fold cross-validation over tasks (fit and pick the threshold on one half,
judge on the other): the shipped logits verifier at its code presets and at an `edit` threshold
picked on the other half; logistic regression on the verifier's score + confidence + copy
features; logistic regression on the draft's hidden state + copy features (trained on edit
trajectories); and the guard (the shipped score, every drafted copy flagged). Usage:

    python tools/edit_verifier_trial.py /tmp/bench/bench.json --out results/edit-verifier-trial.json
"""

from __future__ import annotations

import json

import numpy as np
from edit_replies import parser, setup
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from sprinter_edge import Engine
from sprinter_edge.decoding.proposers.prompt_lookup import SuffixIndex
from sprinter_edge.numerics import confidence
from sprinter_edge.verifiers.base import DraftFeatures
from sprinter_edge.verifiers.calibration import PRESETS
from sprinter_edge.verifiers.loading import resolve_verifier

CHUNK = 256  # rows per draft decode
FLAG_SHARES = (0.1, 0.25, 0.5)  # flag budgets (share of reply tokens sent to the target)
COPY_FEATURES = ("offer", "draft_copies", "log_match", "log_run", "divergence")


def draft_view(engine: Engine, prompt: list[int], reply: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The draft's logits and hidden state at the position that predicts each reply token."""
    logits, hidden = [], []
    for start in range(0, len(reply), CHUNK):
        end = min(len(reply), start + CHUNK)
        out = engine.draft.sync(prompt + reply[:end - 1], n_logits=end - start, hidden=True)
        logits.append(out.logits)
        hidden.append(out.hidden)
    return np.concatenate(logits), np.concatenate(hidden)


def positions(engine: Engine, verifiers: dict, task: str, prompt: list[int], reply: list[int]) -> list[dict]:
    """One record per reply token: label, scores, confidence, copy features, hidden state."""
    logits, hidden = draft_view(engine, prompt, reply)
    index, run, departures, out = SuffixIndex(), 0, 0, []
    for i, token in enumerate(reply):
        index.extend(prompt + reply[:i])
        match, end = index.match()
        copy = index.seq[end] if match and end < len(index.seq) else None
        drafted = int(np.argmax(logits[i]))
        feats = DraftFeatures(hidden=hidden[i], logits=logits[i], token=drafted, run_position=0,
                              output_position=i, temperature=0.0)
        max_prob, entropy = confidence(logits[i])
        out.append({
            "task": task, "y": drafted != token,
            "scores": {name: v.score(feats) for name, v in verifiers.items()},
            "conf": (max_prob, entropy),
            "copy": (float(copy is not None), float(drafted == copy), np.log1p(match), np.log1p(run),
                     departures / (i + 1)),
            "hidden": hidden[i],
        })
        if copy is not None and copy != token:
            departures += 1
        run = run + 1 if copy == token else 0
    return out


def judge(scores: np.ndarray, y: np.ndarray, tasks: np.ndarray, threshold: float) -> dict:
    """Flag share, false passes and tasks reproduced (no false pass) at one threshold."""
    passed_wrong = (scores >= threshold) & y
    names = np.unique(tasks)
    clean = sum(not passed_wrong[tasks == t].any() for t in names)
    return {"threshold": round(float(threshold), 7),  # the scores saturate: 4 digits are too few
            "flag_share": round(float(np.mean(scores < threshold)), 3),
            "false_passes": int(passed_wrong.sum()), "tasks_reproduced": f"{clean}/{len(names)}"}


def threshold_for_share(scores: np.ndarray, share: float) -> float:
    """The threshold that flags `share` of the tokens (lowest scores first)."""
    return float(np.quantile(scores, share))


def zero_fp_threshold(scores: np.ndarray, y: np.ndarray) -> float:
    """The lowest threshold under which no labelled token passes (the fit half's edit preset)."""
    return float(np.nextafter(scores[y].max(), 1.0)) if y.any() else 0.0


def main() -> int:
    args = parser(__doc__, out=True).parse_args()
    _, replies, engine = setup(args, "sprinter")
    engine.load()
    verifiers = {"logits": engine.verifier,
                 "hidden": resolve_verifier("hidden", engine.pair, engine.draft, engine.target)}
    presets = {p: engine.verifier.threshold_for(p, "code", "greedy") for p in PRESETS}
    rows: list[dict] = []
    for r in replies:
        rows += positions(engine, verifiers, r.task, engine.encode(r.text), r.reply)
    engine.close()

    y = np.array([r["y"] for r in rows])
    tasks = np.array([r["task"] for r in rows])
    shipped = np.array([r["scores"]["logits"] for r in rows])
    copy = np.array([r["copy"] for r in rows])
    small = np.column_stack([shipped, np.array([r["conf"] for r in rows]), copy])
    hidden = np.column_stack([np.array([r["hidden"] for r in rows]), copy])
    guard = np.where(copy[:, 1] > 0, 0.0, shipped)  # a drafted copy is always flagged
    names = sorted(set(tasks))
    folds = [np.isin(tasks, names[0::2]), np.isin(tasks, names[1::2])]

    def learned(x: np.ndarray, c: float) -> np.ndarray:
        """Out-of-fold scores: each half scored by a model fit on the other."""
        out = np.zeros(len(y))
        for test in folds:
            model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
            model.fit(x[~test], ~y[~test])  # the score is P(accept), as a verifier's
            out[test] = model.predict_proba(x[test])[:, 1]
        return out

    scorers = {"shipped logits verifier": shipped, "shipped + copy features (logreg)": learned(small, 1.0),
               "hidden state + copy features, trained on edits (logreg)": learned(hidden, 0.01),
               "guard (shipped, every drafted copy flagged)": guard,
               "shipped hidden-state verifier": np.array([r["scores"]["hidden"] for r in rows])}
    report: dict = {"tasks": len(names), "tokens": len(y), "labelled": int(y.sum()),
                    "labelled_and_copied": int((y & (copy[:, 1] > 0)).sum()), "scorers": {}}
    for name, s in scorers.items():
        entry: dict = {}
        if name.startswith("shipped logits") or name.startswith("guard"):
            entry["code presets"] = {p: judge(s, y, tasks, t) for p, t in presets.items()}
        edit_preset, shares = [], {f"flag {int(f * 100)}%": [] for f in FLAG_SHARES}
        for test in folds:  # thresholds picked on the fit half, judged on the held-out half
            edit_preset.append(judge(s[test], y[test], tasks[test], zero_fp_threshold(s[~test], y[~test])))
            for f in FLAG_SHARES:
                shares[f"flag {int(f * 100)}%"].append(
                    judge(s[test], y[test], tasks[test], threshold_for_share(s[~test], f)))
        entry["edit preset (no false pass on the fit half)"] = edit_preset
        entry.update(shares)
        report["scorers"][name] = entry
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
