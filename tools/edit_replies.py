"""What the edit-analysis tools share: the command line over a bench.json, `ar`'s replies to its
edit tasks, and the engine over the pair the bench ran (tools/edit_departures.py,
tools/edit_verifier_trial.py; tools/replay.py reads both edit workloads itself)."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from sprinter_edge import Engine, Hardware
from sprinter_edge.bench.edits import FUNCTIONS
from sprinter_edge.bench.summary import workload_of

log = logging.getLogger("edit_replies")


@dataclass(frozen=True)
class EditReply:
    task: str  # the edit task's id
    edit: str  # its edit (rename_function, ...)
    text: str  # the request as the bench sent it
    reply: list[int]  # ar's reply, token ids


def parser(doc: str, *, out: bool = False) -> argparse.ArgumentParser:
    """The tools' common arguments: a bench.json, the pair, the threads (and --out)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("bench_json", type=Path, help="bench.json of a run with --edits and an ar row")
    ap.add_argument("--pair", default="default", help="the pair the bench ran")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    if out:
        ap.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    return ap


def ar_replies(data: dict) -> list[EditReply]:
    """`ar`'s non-empty replies to the edit tasks of a bench.json, in its order."""
    runs = [r for r in data["runs"] if r["method"] == "ar" and workload_of(r) == "edit"]
    # rebuilt by id: the tasks may lie anywhere in the order (--edit-skip, --split)
    tasks = {r["prompt_id"]: FUNCTIONS.find(r["prompt_id"]) for r in runs}
    prompts = {pid: FUNCTIONS.prompt(t) for pid, t in tasks.items() if t is not None}
    out = []
    for r in runs:
        if r["prompt_id"] not in prompts:
            log.warning("task %s is not among the built tasks: skipped", r["prompt_id"])
        elif r["tokens"]:
            p = prompts[r["prompt_id"]]
            out.append(EditReply(p.id, p.problem["edit"], p.text, list(r["tokens"])))
    return out


def setup(args: argparse.Namespace, method: str) -> tuple[dict, list[EditReply], Engine]:
    """Logging, the bench.json, ar's edit replies and an engine for `method` over the pair."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = json.loads(args.bench_json.read_text())
    engine = Engine.from_pair(args.pair, offline=True, method=method,
                              hardware=Hardware(n_threads=args.threads, n_ctx=4096))
    return data, ar_replies(data), engine
