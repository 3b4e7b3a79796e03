"""Where SPRINTER breaks edits: the draft's confidence and the verifier's score at the positions
where the target's reply departs from a verbatim copy of the prompt (issue 17, item 3).

Reads a `sprinter-edge bench --edits N` output (bench.json), takes each edit task's `ar` reply
(the target's own output), and walks it token by token: where the longest earlier match of the
context (the lookup proposer's own matcher, at least 3 tokens) proposes a copied token and the
target wrote something else, the reply departs from the copy: that is the edit. At every such
position it records the draft's max probability, whether the draft's own token is the copy
(the draft copies where the target edits), and the pair's verifier's score against the code
presets. Usage:

    python tools/edit_departures.py /tmp/bench/bench.json --out results/edit-departures.json
"""

from __future__ import annotations

import json

import numpy as np
from edit_replies import parser, setup

from sprinter_edge import Engine
from sprinter_edge.decoding.proposers.prompt_lookup import SuffixIndex
from sprinter_edge.numerics import confidence
from sprinter_edge.verifiers.base import DraftFeatures
from sprinter_edge.verifiers.calibration import PRESETS

CHUNK = 256  # logits rows per draft decode


def draft_rows(engine: Engine, prompt: list[int], reply: list[int]) -> np.ndarray:
    """The draft's logits row that predicts each reply token (teacher-forced on the reply)."""
    rows = []
    for start in range(0, len(reply), CHUNK):
        end = min(len(reply), start + CHUNK)
        out = engine.draft.sync(prompt + reply[:end - 1], n_logits=end - start)
        rows.append(out.logits)
    return np.concatenate(rows)


def main() -> int:
    args = parser(__doc__, out=True).parse_args()
    _, replies, engine = setup(args, "sprinter")
    engine.load()
    verifier = engine.verifier
    thresholds = {p: verifier.threshold_for(p, "code", "greedy") for p in PRESETS}
    at_departure: list[dict] = []
    elsewhere_conf: list[float] = []
    for r in replies:
        pid, prompt, reply = r.task, engine.encode(r.text), r.reply
        rows = draft_rows(engine, prompt, reply)
        index = SuffixIndex()
        for i, token in enumerate(reply):
            index.extend(prompt + reply[:i])
            match, end = index.match()
            row = rows[i]
            conf = confidence(row)[0]
            copy = index.seq[end] if match and end < len(index.seq) else None
            if copy is None or copy == token:
                elsewhere_conf.append(conf)
                continue
            score = verifier.score(DraftFeatures(hidden=None, logits=row, token=int(np.argmax(row)),
                                                 run_position=0, output_position=i, temperature=0.0))
            at_departure.append({"task": pid, "edit": r.edit, "position": i,
                                 "match": match, "max_prob": round(conf, 4), "score": round(score, 4),
                                 "draft_copies": int(np.argmax(row)) == copy,
                                 "draft_right": int(np.argmax(row)) == token})
    n = len(at_departure)
    summary = {
        "tasks": len(replies), "departures": n,
        "draft_copies_share": sum(d["draft_copies"] for d in at_departure) / max(n, 1),
        "draft_right_share": sum(d["draft_right"] for d in at_departure) / max(n, 1),
        "median_max_prob_at_departures":
            float(np.median([d["max_prob"] for d in at_departure])) if n else None,
        "median_max_prob_elsewhere": float(np.median(elsewhere_conf)) if elsewhere_conf else None,
        "passed_at_preset": {p: sum(d["score"] >= t for d in at_departure) / max(n, 1)
                             for p, t in thresholds.items()},
        "passed_and_copied_at_preset": {
            p: sum(d["score"] >= t and d["draft_copies"] for d in at_departure) / max(n, 1)
            for p, t in thresholds.items()},
        "thresholds": thresholds,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "departures": at_departure}, indent=1))
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
