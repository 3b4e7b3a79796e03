"""Replay the lookup proposer along `ar`'s recorded greedy replies to a bench run's edit tasks,
priced from this machine's cost table: how a copy policy would do, without running the models.

Under greedy decoding the reply is fixed (`ar`'s tokens; `lookup`'s and `auto`'s equal them), so
the target's part is known in advance. The replay runs the decoder's own loop (`run_loop`: the
acceptor, the counters) with the loop's own proposer (`PromptLookup`) against a stand-in target
whose every logits row picks the recorded reply's next token: a proposal's accepted length is its
common prefix with what the target wrote, and each call is priced from the cost table at its
size, rows and context depth, as the proposer prices it. The prompts are rebuilt from the task
ids (`TaskSet.find`, both edit workloads) and encoded by the engine with the chat template (the
target is loaded to tokenize, never to generate); the copy evidence is kept across the tasks in
the bench's order, as `auto` keeps it. It predicts time in target calls only (the bench's
`time_split` puts 99.7% of lookup's decode there).

Costs are read with the public reader (`costs.table.read_costs`): `--costs FILE`, else this
machine's cached table for the target (`cost_file`), else a fixed table (nothing is timed) unless
`--measure-costs` times one now (`machine_costs`). Policy variants (`VARIANTS`) are the
proposer's and the copy evidence's own parameters. Only the tasks of one side of the edit tasks'
split are replayed (`--split`, default "tuning": what tuning may look at). Subcommands:

    python tools/replay.py policies results/bench-results-edits.json --variants shipped,no-anchor
    python tools/replay.py tasks results/bench-results-file-edits.json --trace stat
    python tools/replay.py bounds results/bench-results-file-edits-report-kinds-xeon.json \
        --split report --costs results/bench-results-file-edits-report-kinds-xeon.json
    python tools/replay.py forks results/bench-results-file-edits-report-type-hints.json --split report

`policies`: per variant, the predicted speed, calls, plain steps and rows; where the time goes
against the ceiling; and the copy bound (an oracle that copies every n-gram continuation seen
before and batches every copied token at the cheapest cost per row), both priced after the cost
table's base depth, as a quick yardstick (`bounds` prices each token at its depth). It bounds
copying from what was seen: the edit memory, which writes a learned substitution where its
n-gram was never seen, can pass the 3-gram oracle (renames, reformats); the 1-gram one is the
generous bound. `tasks`:
per task, the share of proposed tokens the target accepts against the bench row's counters;
`--trace TASK` prints every refused proposal of the tasks whose id contains TASK, with the edit
memory's substitutions at the end. `bounds`: per edit kind, as x ar and a share of the floor, the
bench's measured speed, the shipped copy replayed, the copy bounds, and the same bounds with a
perfect draft writing every token no copy gives (a draft step and a floor row each, its catch-up
free; the draft's costs from `--costs`' bench.json): how much of the gap a draft could close.
`forks`: what a second candidate verified in the same call would save (at each proposal's first
fork, the other continuation seen last, as a branch of a batch's second sequence) against the
rows it adds, priced along the shipped replay, and with an oracle that adds it only where it wins.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from sprinter_edge import Engine, Hardware
from sprinter_edge.backend.llama import DecodeOutput, common_prefix
from sprinter_edge.bench.costmodel import CostModel
from sprinter_edge.bench.edits import FILES, FUNCTIONS, SPLITS, TaskSet
from sprinter_edge.bench.edits.tasks import SEALED
from sprinter_edge.costs import Costs, CostTable, Evidence
from sprinter_edge.costs.table import cost_file, machine_costs, read_costs
from sprinter_edge.decoding import DecodeContext, Stats
from sprinter_edge.decoding.context import Step
from sprinter_edge.decoding.lookup import COPIES
from sprinter_edge.decoding.loop import run_loop
from sprinter_edge.decoding.proposers.base import Proposal, Proposer
from sprinter_edge.decoding.proposers.copy_evidence import CopyEvidence
from sprinter_edge.decoding.proposers.edit_memory import Applied, Tokenizer
from sprinter_edge.decoding.proposers.prompt_lookup import (
    MIN_MATCH,
    SHIPPED,
    CopyPolicy,
    PromptLookup,
    SuffixIndex,
)
from sprinter_edge.decoding.sampling import Sampler, SamplingParams

log = logging.getLogger("replay")

# used when no cost table is found: a 64-row call costs what 8 single steps cost
FALLBACK = CostTable(last={1: 10.0, 64: 80.0}, full={1: 10.0, 64: 80.0})
KIND = "edit"  # the request kind the copy evidence is kept under (both edit workloads are edits)

# name: (the copy's policy, CopyEvidence.with_priors's keywords); "shipped" is the defaults
VARIANTS: dict[str, tuple[CopyPolicy, dict[str, Any]]] = {
    "shipped": (SHIPPED, {}),
    "no-anchor": (replace(SHIPPED, anchor=False), {}),
    "no-memory": (replace(SHIPPED, learn_edits=False), {}),
    "no-respell": (replace(SHIPPED, respell=False), {}),
    "no-layout": (replace(SHIPPED, layout=False), {}),
    "no-align": (replace(SHIPPED, align_window=0), {}),
    "no-resume-edits": (replace(SHIPPED, resume_edits=False), {}),
    "no-return-home": (replace(SHIPPED, return_home=False), {}),
    "no-resume-no-return": (replace(SHIPPED, resume_edits=False, return_home=False), {}),
    "no-line-rates": (replace(SHIPPED, line_rates=False), {}),
    "reply-edits": (replace(SHIPPED, reply_edits=True), {}),
    "align-window-8": (replace(SHIPPED, align_window=8), {}),
    "anchor-prior-0.8": (SHIPPED, {"anchor_prior": 0.8}),
    "anchor-prior-0.9": (SHIPPED, {"anchor_prior": 0.9}),
    "anchor-window-16": (replace(SHIPPED, anchor_window=16), {"anchor_prior": 0.8}),
    "spec-factor-4": (replace(SHIPPED, spec_factor=4), {}),
    "spec-factor-8": (replace(SHIPPED, spec_factor=8), {}),
    "min-match-2": (replace(SHIPPED, min_match=2), {"buckets": (2, 3, 4, 6, 10, 16),
                                                    "prior": (0.4, 0.55, 0.7, 0.85, 0.92, 0.96)}),
    "min-match-1": (replace(SHIPPED, min_match=1), {"buckets": (1, 2, 3, 4, 6, 10, 16),
                                                    "prior": (0.3, 0.4, 0.55, 0.7, 0.85, 0.92, 0.96)}),
}


# ---------------------------------------------------------------------------- the tasks


@dataclass(frozen=True)
class Recorded:
    task: str  # the edit task's id
    prompt: list[int]  # the request as the bench sent it, encoded
    reply: list[int]  # ar's reply, token ids
    bench: dict[str, Any]  # the compared row's (`--method`) run of this task ({} if none)

    @property
    def stats(self) -> dict[str, Any]:
        return self.bench.get("stats") or {}


def task_set_of(task_id: str) -> TaskSet | None:
    """The edit workload whose tasks `task_id` names (`workload/edit/source`; None: another)."""
    return next((ts for ts in (FUNCTIONS, FILES) if task_id.partition("/")[0] == ts.workload), None)


def in_split(tasks: TaskSet, task_id: str, split: str | None) -> bool:
    """Whether the task lies on `split`'s side (None: tuning and report, never the sealed set,
    which is not replayed): its source is among the split's sources, matched as `TaskSet.find`
    matches a task id's source."""
    name = task_id.split("/", 2)[-1]

    def on(side: str) -> bool:
        return any(name in (s, s.split("/")[-1]) for s in tasks.source_names(side))

    return not on(SEALED) if split is None else on(split)


def recorded_replies(data: dict, split: str | None) -> list[tuple[str, str]]:
    """(task id, request text) of `ar`'s non-empty edit replies in `data`, in the bench's order,
    only those on `split`'s side."""
    out = []
    for run in data["runs"]:
        if run["method"] != "ar" or not run["tokens"]:
            continue
        pid = run["prompt_id"]
        tasks = task_set_of(pid)
        if tasks is None:
            continue  # not an edit task (humaneval, chat, ...)
        # THE SPLIT: the one place the tuning/report split of the edit tasks is applied
        if not in_split(tasks, pid, split):
            continue
        task = tasks.find(pid)
        if task is None:
            log.warning("task %s is not among the built tasks: skipped", pid)
            continue
        out.append((pid, tasks.prompt(task).text))
    return out


def costs_of(path: Path) -> CostModel:
    """The target's cost table in a cost-cache file, or the tables a bench run recorded (its
    bench.json's `cost_model`, the draft's too: the run's own machine), made monotone."""
    data = json.loads(path.read_text())
    if "cost_model" not in data:
        return CostModel(read_costs(path))
    model = CostModel.from_dict(data["cost_model"])
    for table in (model.target, model.draft):
        if table is not None:
            table.make_monotone()
    return model


def load(args: argparse.Namespace) -> tuple[list[Recorded], Engine, CostModel, dict]:
    """The replayed tasks, an engine over the pair (to tokenize), the costs (the draft's only
    where `--costs` is a bench.json that recorded them), the bench.json."""
    data = json.loads(args.bench_json.read_text())
    split = None if args.split == "all" else args.split
    engine = Engine.from_pair(args.pair, offline=True, method="lookup",
                              hardware=Hardware(n_threads=args.threads, n_ctx=4096))
    replies = {r["prompt_id"]: list(r["tokens"]) for r in data["runs"] if r["method"] == "ar"}
    bench = {r["prompt_id"]: r for r in data["runs"] if r["method"] == args.method}
    recorded = [Recorded(pid, engine.encode(text), replies[pid], bench.get(pid, {}))
                for pid, text in recorded_replies(data, split)]
    if args.costs is not None:
        model, where = costs_of(args.costs), str(args.costs)
    elif cost_file(engine.target).is_file():
        model, where = CostModel(read_costs(cost_file(engine.target))), "this machine's cached table"
    elif args.measure_costs:
        model, where = CostModel(machine_costs(engine.target)), "measured now"
    else:
        model, where = CostModel(FALLBACK), "a fixed table (no cached one here: --measure-costs times one)"
    print(f"costs: {where}; {len(recorded)} edit replies of ar on the {args.split} side")
    return recorded, engine, model, data


# ---------------------------------------------------------------------------- the replay


class RecordedTarget:
    """The target of a replay: the decode loop calls it as it calls the model (`sync`), and
    every logits row it returns picks the recorded reply's token at that position (one-hot).
    Each call is priced from `costs` at its size, rows and the depth it runs after."""

    def __init__(self, prompt: list[int], reply: list[int], costs: CostTable, is_eog: Callable[[int], bool],
                 tokenizer: Tokenizer | None = None):
        self.prompt, self.reply, self.costs, self._is_eog = prompt, reply, costs, is_eog
        self.tokenizer = tokenizer  # spells renames for the edit memory (None: no respelling)
        self.tokens: list[int] = list(prompt)  # the prompt was read before the first step (prefill)
        self.last_decoded = 0
        self.n_vocab = max([*prompt, *reply]) + 1
        self.ms = 0.0
        self.calls: list[tuple[int, int, float]] = []  # per call: the depth it ran after, tokens, ms

    def sync(self, context: list[int], *, n_logits: int = 1, hidden: bool = False) -> DecodeOutput:
        keep = min(common_prefix(self.tokens, context), len(context) - n_logits)
        n = len(context) - keep
        rows = min(n_logits, n)
        table = self.costs.at(keep)
        ms = table.all_rows(n) if rows == n else table.cost(n, rows)
        self.ms += ms
        self.calls.append((keep, n, ms))
        self.tokens, self.last_decoded = list(context), n
        logits = np.zeros((rows, self.n_vocab), np.float32)
        first = len(context) - rows + 1 - len(self.prompt)  # the reply position row 0 predicts
        if first + rows > len(self.reply):
            raise RuntimeError("the replay asked for a token past the recorded reply")
        logits[np.arange(rows), self.reply[first:first + rows]] = 1.0
        return DecodeOutput(logits, None)

    def is_eog(self, token: int) -> bool:
        return self._is_eog(token)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.tokenizer.token_bytes(token, special=special) if self.tokenizer else b""

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True) -> list[int]:
        if self.tokenizer is None:
            return []
        return self.tokenizer.tokenize(text, add_special=add_special, special=special)


@dataclass
class Round:
    pos: int  # reply tokens committed before it
    proposal: Proposal
    accepted: int
    by: list[Applied | None] = field(default_factory=list)  # the edit memory's substitution per token


class Watched(Proposer):
    """A proposer as the loop sees it, each round recorded (what it proposed, what was kept)."""

    def __init__(self, inner: PromptLookup) -> None:
        self.inner = inner
        self.rounds: list[Round] = []
        self._start = self._pos = 0

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        self._start = len(prompt)
        self.inner.begin(ctx, prompt)

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        self._pos = len(seq) - self._start
        return self.inner.propose(ctx, seq)

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        offer = self.inner.offer  # read before feedback
        by = [t.by for t in offer.copy[:len(proposal)]] if proposal.tokens and offer else []
        self.rounds.append(Round(self._pos, proposal, accepted, by))
        self.inner.feedback(ctx, proposal, accepted)


@dataclass
class Replayed:
    ms: float  # predicted target milliseconds
    stats: Stats  # the loop's counters (target calls, rows, copied tokens offered and accepted)
    rounds: list[Round]
    calls: list[tuple[int, int, float]]  # the target's, one a round: depth, tokens, ms

    @property
    def plain(self) -> int:
        return sum(not r.proposal.tokens for r in self.rounds)


def replay(proposer: PromptLookup, costs: CostTable, evidence: Evidence, prompt: list[int],
           reply: list[int], is_eog: Callable[[int], bool], tokenizer: Tokenizer | None = None) -> Replayed:
    """Decode `reply` with the loop and `proposer` against its recorded target (`tokenizer`:
    the model's, so the edit memory respells renames as in the bench)."""
    target = RecordedTarget(prompt, reply, costs, is_eog, tokenizer)
    stats = Stats(method="lookup")
    ctx = DecodeContext(target=target, draft=None,  # type: ignore[arg-type]  # the stand-in
                        sampler=Sampler(SamplingParams(temperature=0.0)), stats=stats,
                        max_new_tokens=len(reply), costs=Costs(costs), evidence=evidence, kind=KIND)
    watched = Watched(proposer)
    steps = run_loop(ctx, prompt, watched)
    committed: list[int] = []
    step: Step
    for step in steps:
        for token, origin in step:
            stats.counters.count(origin)
            committed.append(token)
        ctx.produced = len(committed)
        if len(committed) >= len(reply):
            break
    steps.close()
    if committed[:len(reply)] != reply:
        raise RuntimeError("the replay left the recorded reply")
    return Replayed(target.ms, stats, watched.rounds, target.calls)


def proposer_of(variant: str, evidence: Evidence) -> PromptLookup:
    """The loop's proposer under `variant`, its copy evidence kept in `evidence` for edits."""
    copy_policy, priors = VARIANTS[variant]
    copies = evidence.of_kind(COPIES, KIND, lambda: CopyEvidence.with_priors(**priors))
    return PromptLookup(copies, copy_policy=copy_policy)


# ---------------------------------------------------------------------------- policies


def cheapest_row(target: CostTable) -> tuple[int, float]:
    """(n, ms per row) of the all-rows call with the cheapest row (2-32 tokens)."""
    best_n = min(range(2, 33), key=lambda n: target.all_rows(n) / n)
    return best_n, target.all_rows(best_n) / best_n


def bottleneck(target: CostTable, total_ms: float, tokens: int, plain: int, rows: int) -> str:
    """Where the time goes against the ceiling (every token one row of the cheapest call per
    row: a full, fully accepted batch): plain steps, rejected rows, calls smaller than that."""
    best_n, floor = cheapest_row(target)
    batched_ms = total_ms - plain * target.cost(1)
    batched_rows, batched_tokens = rows - plain, tokens - plain
    per_row = batched_ms / max(batched_rows, 1)
    parts = {"plain steps": plain * (target.cost(1) - floor),
             "rejected rows": (batched_rows - batched_tokens) * per_row,
             "smaller calls": batched_tokens * (per_row - floor)}
    return (f"ceiling {1000 / floor:.1f} tok/s ({floor:.1f} ms a row at {best_n} rows); over it: "
            + ", ".join(f"{k} {v / 1000:.1f} s" for k, v in parts.items()))


def forced_flags(prompt: list[int], reply: list[int], n: int = MIN_MATCH) -> list[bool]:
    """Per reply token, whether it needs a one-token target call that no copy can avoid: a reply
    token is copyable when the n tokens before it occurred earlier in the prompt or the reply
    followed by it (an oracle that always picks the right earlier occurrence). A run of m tokens
    none copies costs m - 1 such calls at the least (its first token is the target's own token at
    the end of the call before): its second and later tokens are flagged."""
    seen: set[tuple[int, ...]] = set()
    seq = list(prompt)
    for end in range(n + 1, len(seq) + 1):
        seen.add(tuple(seq[end - n - 1:end]))
    flags, run = [], 0
    for token in reply:
        gram = tuple(seq[-n:]) + (token,) if len(seq) >= n else None
        if gram is not None and gram in seen:
            flags.append(False)
            run = 0
        else:
            flags.append(run > 0)
            run += 1
        seq.append(token)
        if len(seq) > n:
            seen.add(tuple(seq[-n - 1:]))
    return flags


def copy_bound(target: CostTable, recorded: Sequence[Recorded], n: int) -> str:
    """The fastest any exact decoding that proposes copies can be: the forced plain steps at
    c(1) each and every other token one row of the cheapest call per row."""
    _, floor = cheapest_row(target)
    tokens = sum(len(r.reply) for r in recorded)
    forced = sum(sum(forced_flags(r.prompt, r.reply, n)) for r in recorded)
    ms = forced * target.cost(1) + (tokens - forced) * floor
    return (f"copy bound (an oracle copying every {n}-gram continuation seen before): {forced} forced "
            f"one-token calls, {tokens / ms * 1000:.1f} tok/s at best ({ms / 1000:.1f} s)")


def policies(args: argparse.Namespace) -> int:
    recorded, engine, model, _ = load(args)
    table = model.target
    is_eog = engine.target.is_eog
    tokens = sum(len(r.reply) for r in recorded)
    seconds = sum(r.bench.get("decode_seconds", 0.0) for r in recorded)
    if seconds:
        print(f"measured {args.method}: {tokens / seconds:.1f} tok/s ({seconds:.1f} s decode)")
    for name in args.variants.split(","):
        evidence = Evidence()  # each variant learns from the first task on
        total, calls, plain, rows = 0.0, 0, 0, 0
        for r in recorded:
            done = replay(proposer_of(name, evidence), table, evidence, r.prompt, r.reply, is_eog,
                          engine.target)
            total += done.ms
            calls += done.stats.counters.target_calls
            plain += done.plain
            rows += done.stats.counters.target_tokens
        print(f"{name:>18}: {tokens / total * 1000:.1f} tok/s predicted ({total / 1000:.1f} s), "
              f"{calls} target calls ({plain} plain steps), {rows} rows for {tokens} tokens")
        print("                    " + bottleneck(table, total, tokens, plain, rows))
    for n in (MIN_MATCH, 1):
        print(copy_bound(table, recorded, n))
    engine.close()
    return 0


# ---------------------------------------------------------------------------- bounds


def edit_kind(task_id: str) -> str:
    """The edit kind a task id names (`workload/kind/source`)."""
    return task_id.split("/")[1]


def measured_ratio(data: dict, tasks: set[str], method: str) -> float | None:
    """The bench's tokens/s of `method` over ar's on these tasks' decode (None: no such rows)."""
    def tps(m: str) -> float | None:
        runs = [r for r in data["runs"] if r["method"] == m and r["prompt_id"] in tasks]
        seconds = sum(r.get("decode_seconds", 0.0) for r in runs)
        return sum(len(r["tokens"]) for r in runs) / seconds if seconds else None
    mine, ar = tps(method), tps("ar")
    return mine / ar if mine and ar else None


BOUND_COLUMNS = ("measured", "replayed", "copy3", "copy3+draft", "copy1", "copy1+draft")


def bounds(args: argparse.Namespace) -> int:
    recorded, engine, model, data = load(args)
    table = model.target
    if model.draft is None:
        print("no draft costs (--costs names no bench.json with a draft): the draft's bounds are left out")
    is_eog = engine.target.is_eog
    evidence = Evidence()  # kept across the tasks in the bench's order, as auto keeps it
    shipped = {r.task: replay(proposer_of("shipped", evidence), table, evidence, r.prompt, r.reply,
                              is_eog, engine.target).ms for r in recorded}
    engine.close()
    kinds = sorted({edit_kind(r.task) for r in recorded})
    rows = []
    for kind in [*kinds, "all"] if len(kinds) > 1 else kinds:
        rs = [r for r in recorded if kind in ("all", edit_kind(r.task))]
        ar_ms, _ = model.priced([(len(r.prompt), [True] * len(r.reply)) for r in rs])
        ratios = [measured_ratio(data, {r.task for r in rs}, args.method),
                  ar_ms / sum(shipped[r.task] for r in rs)]
        for n in (MIN_MATCH, 1):
            flagged = [(len(r.prompt), forced_flags(r.prompt, r.reply, n)) for r in rs]
            ratios.append(model.bound_ratio(flagged))
            ratios.append(model.bound_ratio(flagged, draft_writes=True) if model.draft else None)
        rows.append({"kind": kind, "tasks": len(rs), "tokens": sum(len(r.reply) for r in rs),
                     "floor": model.floor_ratio([(len(r.prompt), len(r.reply)) for r in rs]),
                     **dict(zip(BOUND_COLUMNS, ratios, strict=True))})
    names = [f"{args.method} measured", "shipped replayed",
             *(f"{what} {n}-gram" for n in (MIN_MATCH, 1) for what in ("copy", "copy+draft"))]
    print("each: x ar (share of the floor); the floor is every token one row of the cheapest call")
    print(f"{'kind':22s} {'tokens':>6s} {'floor':>6s} " + " ".join(f"{c:>18s}" for c in names))
    for row in rows:
        floor = row["floor"] or 0.0
        cells = [f"{x:.2f}x ({x / floor:4.0%})" if x and floor else "-" for x in
                 (row[c] for c in BOUND_COLUMNS)]
        print(f"{row['kind']:22s} {row['tokens']:6d} {floor:5.2f}x " + " ".join(f"{c:>18s}" for c in cells))
    if args.out is not None:
        command = ["python", "tools/replay.py", "bounds", str(args.bench_json), "--split", args.split,
                   *(["--costs", str(args.costs)] if args.costs else []), "--method", args.method]
        args.out.write_text(json.dumps({"command": " ".join(command), "bench": str(args.bench_json),
                                        "method": args.method, "min_match": MIN_MATCH, "rows": rows},
                                       indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------- forks


def fork_of(seq: Sequence[int], ends: dict[tuple[int, ...], list[int]], base: int,
            proposal: Sequence[int], n: int = MIN_MATCH) -> tuple[int, int] | None:
    """The proposal's first fork, made after seq[:base]: (j, e) for the first proposed token j whose
    n tokens before it were followed by another token earlier in seq[:base], e where the most
    recent such continuation starts; None: no fork (`ends`: where each n-gram of `seq` ends,
    ascending, as the proposer's `SuffixIndex.where` keeps them)."""
    for j in range(len(proposal)):
        window = tuple([*seq[max(0, base + j - n):base], *proposal[max(0, j - n):j]][-n:])
        found = ends.get(window, [])
        for e in reversed(found[:bisect.bisect_left(found, base)]):
            if seq[e] != proposal[j]:
                return j, e
    return None


def forks(args: argparse.Namespace) -> int:
    """A second candidate in the same target call: at each proposal's first fork, the most recent
    other continuation seen, as a branch of `cap` tokens verified beside the proposal (two
    sequences of one batch). Priced post hoc along the shipped replay: the rows it adds to each
    call, and where the target took the branch, the rounds after it that its accepted tokens
    make unneeded. `oracle` adds a branch only where it wins."""
    recorded, engine, model, _ = load(args)
    table = model.target
    caps = [int(c) for c in args.caps.split(",")]
    extra, saved, oracle = ({c: 0.0 for c in caps} for _ in range(3))
    n_forks, wins = 0, {c: 0 for c in caps}
    total = 0.0
    evidence = Evidence()
    for r in recorded:
        done = replay(proposer_of("shipped", evidence), table, evidence, r.prompt, r.reply,
                      engine.target.is_eog, engine.target)
        total += done.ms
        seq = [*r.prompt, *r.reply]
        index = SuffixIndex()
        index.extend(seq)
        ends = index.where
        starts = [rd.pos for rd in done.rounds] + [len(r.reply)]
        for i, rd in enumerate(done.rounds):
            base, proposal = len(r.prompt) + rd.pos, rd.proposal.tokens
            fork = fork_of(seq, ends, base, proposal) if proposal else None
            if fork is None:
                continue
            n_forks += 1
            j, e = fork
            depth, tokens, _ = done.calls[i]
            at = table.at(depth)
            for cap in caps:
                branch = seq[e:min(e + cap, base)]
                added = at.all_rows(tokens + len(branch)) - at.all_rows(tokens)
                extra[cap] += added
                if rd.accepted != j or not branch or seq[base + j] != branch[0]:
                    continue
                took = common_prefix(branch, seq[base + j:])
                end = rd.pos + j + took + 1  # the reply position after the branch and the target's token
                gain = 0.0
                for k in range(i + 1, len(done.rounds)):
                    if starts[k + 1] > end:
                        break
                    gain += done.calls[k][2]
                wins[cap] += 1
                saved[cap] += gain
                oracle[cap] += gain - added
    engine.close()
    print(f"shipped replayed: {total / 1000:.1f} s; {n_forks} proposals with a fork")
    print(f"{'branch':>8s} {'wins':>5s} {'rows added':>11s} {'saved':>8s} {'net':>7s} {'oracle net':>11s}")
    for cap in caps:
        print(f"{cap:>8d} {wins[cap]:5d} {extra[cap] / 1000:10.1f}s {saved[cap] / 1000:7.1f}s "
              f"{(saved[cap] - extra[cap]) / total:+7.1%} {oracle[cap] / total:+11.1%}")
    return 0


# ---------------------------------------------------------------------------- tasks


def show_span(model: Any, tokens: Any) -> str:
    """Tokens as their text pieces, `|` between them, newlines shown."""
    return "|".join(model.detokenize([t]) for t in tokens).replace("\n", "\\n")


def trace_refused(model: Any, done: Replayed, reply: list[int], proposer: PromptLookup,
                  verbose: bool = False) -> None:
    """Every refused proposal of a replay: where, what was proposed, what the target wrote
    (`verbose`: the whole proposal, after the reply before it)."""
    for rnd in done.rounds:
        k, ok = len(rnd.proposal), rnd.accepted
        if ok >= k:
            continue
        got, want = rnd.proposal.tokens[ok], reply[rnd.pos + ok]
        by = rnd.by[ok] if ok < len(rnd.by) else None
        before = show_span(model, reply[max(rnd.pos + ok - 6, 0):rnd.pos + ok])
        made = "copy" if by is None else "sub"
        print(f"    @{rnd.pos:5d} +{ok:2d}/{k:2d} wasted {k - ok:2d}  after {before}: proposed "
              f"{show_span(model, [got])} ({made}), wrote {show_span(model, [want])}")
        if verbose:
            print(f"           from {show_span(model, reply[max(rnd.pos - 8, 0):rnd.pos])} ~ "
                  f"{show_span(model, rnd.proposal.tokens)}")
    for sub in proposer.memory.subs.values():
        prose = sub.prose_accepted or sub.prose_refused
        print(f"      sub {show_span(model, sub.key)} -> {show_span(model, sub.value)} "
              f"{'ctx' if sub.contextual else '   '} +{sub.accepted} -{sub.refused}"
              + (f" (in prose +{sub.prose_accepted} -{sub.prose_refused})" if prose else ""))


def tasks(args: argparse.Namespace) -> int:
    recorded, engine, costs, _ = load(args)
    table = costs.target
    is_eog, model = engine.target.is_eog, engine.text_model
    evidence = Evidence()
    proposed = accepted = 0
    total_ms = 0.0
    for r in recorded:
        if r.stats.get("prompt_tokens") not in (None, len(r.prompt)):
            print(f"  {r.task}: prompt has {len(r.prompt)} tokens, the bench's {r.stats['prompt_tokens']}")
        if args.fresh:
            evidence = Evidence()
        proposer = proposer_of(args.variant, evidence)
        done = replay(proposer, table, evidence, r.prompt, r.reply, is_eog, engine.target)
        c = done.stats.counters
        proposed, accepted = proposed + c.copied_tokens, accepted + c.copied_accepted
        total_ms += done.ms
        # the counters' names before and after their rename (archived runs have the old ones)
        got = r.stats.get("copied_accepted", r.stats.get("lookup_accepted"))
        offered = r.stats.get("copied_tokens", r.stats.get("lookup_tokens"))
        b = f"{got}/{offered} = {got / max(offered, 1):.3f}" if offered is not None else "-"
        print(f"{r.task:48s} replay {c.copied_accepted:4d}/{c.copied_tokens:4d} = "
              f"{c.copied_accepted / max(c.copied_tokens, 1):.3f} ({c.target_calls:3d} calls, "
              f"{done.ms / 1000:5.1f} s predicted)   {args.method} {b}")
        if args.trace and args.trace in r.task:
            trace_refused(model, done, r.reply, proposer, args.verbose)
    print(f"{'all':48s} replay {accepted:4d}/{proposed:4d} = {accepted / max(proposed, 1):.3f} "
          f"({total_ms / 1000:.1f} s predicted)")
    engine.close()
    return 0


# ---------------------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("bench_json", type=Path, help="bench.json of a run with edit tasks and an ar row")
    common.add_argument("--pair", default="default", help="the pair the bench ran (its target tokenizes)")
    common.add_argument("--threads", type=int, default=2, help="CPU threads of the tokenizing engine")
    common.add_argument("--split", default="tuning", choices=(*(s for s in SPLITS if s != SEALED), "all"),
                        help="replay only the edit tasks on this side of the split (all: both)")
    common.add_argument("--costs", type=Path, default=None,
                        help="a cost-cache file, or a bench.json whose recorded costs price the calls "
                             "(None: this machine's cached table)")
    common.add_argument("--measure-costs", action="store_true",
                        help="time the target now when no cost table is cached (off: a fixed table)")
    common.add_argument("--method", default=None,
                        help="the bench row compared with the replay (None: lookup for policies, "
                             "auto for tasks)")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("policies", parents=[common], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="predicted speed of copy-policy variants, where the time goes, the copy bound")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from: {', '.join(VARIANTS)}")
    p.set_defaults(run=policies, default_method="lookup")
    b = sub.add_parser("bounds", parents=[common], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="per edit kind, the measured and replayed speed against the floor and "
                            "the copy's and a perfect draft's bounds")
    b.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON), for "
                   "tools/render_tables.py")
    b.set_defaults(run=bounds, default_method="auto")
    f = sub.add_parser("forks", parents=[common], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="what verifying a second candidate at each proposal's first fork, in the "
                            "same call, would save and cost")
    f.add_argument("--caps", default="4,8,16", help="comma-separated branch lengths (tokens) to price")
    f.set_defaults(run=forks, default_method="auto")
    t = sub.add_parser("tasks", parents=[common], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="per task, the share of copied tokens accepted, against the bench's")
    t.add_argument("--variant", default="shipped", choices=tuple(VARIANTS), help="the policy replayed")
    t.add_argument("--trace", default=None, help="print refused proposals of tasks whose id contains this")
    t.add_argument("--verbose", action="store_true", help="with --trace: each refused proposal whole, "
                   "with the reply before it")
    t.add_argument("--fresh", action="store_true",
                   help="copy evidence from its priors for each task (no carry-over between tasks)")
    t.set_defaults(run=tasks, default_method="auto")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.method is None:
        args.method = args.default_method
    if getattr(args, "variants", None):
        unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
        if unknown:
            print(f"unknown variant {', '.join(unknown)}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
