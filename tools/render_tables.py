#!/usr/bin/env python3
"""Render the results tables of README.md and docs/*.md from the raw runs in results/.

A table in a page is the text between `<!-- table: NAME -->` and `<!-- /table -->`; NAME is a
key of TABLES below, which says which raw file(s), rows and columns it shows. The caption (date,
machine, command) comes from the file's line in results/README.md (date, machine) and the
file's own `command` (a file without one: its line's); every number from the file. Nothing is
typed by hand, and a file without a line in results/README.md is an error.

    python3 tools/render_tables.py          # rewrite the tables in place
    python3 tools/render_tables.py --check  # exit 1 and show the difference when a page is stale

Kinds of table:

* `Table`: rows of one or more `sprinter-edge bench` runs (bench.json: summary `rows`, `groups`
  per workload, every run in `runs`), one row per method, the columns named from COLUMNS. A
  column may name a selection after `@`: a workload of the file's `groups` (`vs ar@chat`), or
  prompts picked from its runs, `id:PREFIX` (prompt ids that start with PREFIX) or `from:K`
  (every prompt after the first K), whose row is recomputed from those runs as the bench
  computes its rows (tok/s: each run's tok/s weighted by its decode time, as
  `sprinter_edge/bench/summary.py` does). A column ending in `?` is shown only when some row has
  a value for it.
* `Curves`: a bench.json's cost table (ms per decode call of n tokens, after 64 tokens of context).
* `Depths`: the same cost table after deeper contexts.
* `Trial`: results/edit-verifier-trial.json (`tools/edit_verifier_trial.py`).
* `Bounds`: `tools/replay.py bounds --out` files: per edit kind, the measured and replayed speed
  against the floor and the copy's and a perfect draft's bounds.
* `Agents`: an agents.json (`bench --agents`): one row per server and aider edit format.
* `Network`: an rpc.json (`bench --rpc-delays`): each row's speed at each network delay.
* `Session`: a session.json (`bench --session`): one row per pass and server, the session's
  totals against the baseline row's; `turns=True`: one row per turn, a group of columns per server.

Stdlib only, but for the floor column (`of floor`: a row's ratio over ar against the floor's,
every token one row of the cheapest call at its depth), which the package's cost model prices.
tests/test_docs.py runs --check.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sprinter_edge.bench.summary import SummaryRow

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
PAGES = ("README.md", "docs/results.md", "docs/journal.md", "docs/rpc.md")
# inputs renamed since a run recorded its command: the caption names the file as it is now
RENAMED = {"results/prompts-fresh-session7.jsonl": "results/prompts-fresh.jsonl",
           "docs/prompts-fresh-session7.jsonl": "results/prompts-fresh.jsonl"}
# extraction fields every method copies from the pasted source (structured tasks): the second
# field-accuracy column leaves them out
COPIED_FIELDS = ("name", "parameter_names")
STRUCTURED_FIELDS = ("name", "parameter_names", "defaults", "returns_value", "raises")
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)
CITED = re.compile(r"\]\((?:\.\./)?results/([\w.-]+\.json)\)")

# how a row is named unless a table names it otherwise (other methods: the method in code type)
NAMES = {
    "llama-server": "llama.cpp server, plain",
    "llama-server-draft": "llama.cpp server `-md`, defaults (3, p_min 0)",
    "llama-server-draft-tuned": "llama.cpp server `-md`, 16 / p_min 0.75",
    "llama-server-ngram-mod": "llama.cpp server, ngram-mod",
    "llama-server-ngram-simple": "llama.cpp server, ngram-simple",
    "llama-server-ngram-simple-tuned": "llama.cpp server, ngram-simple 6 / 32 (tuned)",
    "llama-cpp": "llama-cpp-python",
    "llama-cpp-draft": "llama-cpp-python `draft_model=`",
    "llama-cpp-lookup": "llama-cpp-python `LlamaPromptLookupDecoding` (2, 10)",
}
# edit-verifier-trial.json's names of a setting and a scorer
NO_FALSE_PASS = "edit preset (no false pass on the fit half)"
HIDDEN_ON_EDITS = "hidden state + copy features, trained on edits (logreg)"


def edit_columns(edits: tuple[str, ...]) -> tuple[str, ...]:
    """A `vs ar` column per whole-file edit kind, the tasks of each kind together."""
    return tuple(f"vs ar@id:file_edit/{e}/" for e in edits)


def edit_headers(edits: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Those columns' headers: the kind's name."""
    return tuple((c, e.replace("_", " ")) for c, e in zip(edit_columns(edits), edits, strict=True))


# the whole-file report run's edits, one task each, a column each
REPORT_EDITS = ("rename_parameter", "type_hints", "fstring", "add_docstrings", "reformat")
SWEEP_EDITS = ("rename_parameter", "type_hints", "fstring", "reformat")  # the whole-file sweep's
KIND_EDITS = ("rename_parameter", "add_docstrings", "reformat")  # the kinds measured beside the rewrites
# the report runs' columns: a column per edit, the tasks of each edit together
REPORT_COLUMNS = ("method", "tok/s", "vs ar", "of floor", *edit_columns(REPORT_EDITS),
                  "ttft", "e2e vs ar", "calls/tok", "done", "plans")
RENAME_COPIES = "copy acc@id:file_edit/rename_parameter/"  # the renames' copied-token acceptance
RENAME_COPIES_HEADER = (RENAME_COPIES, "copied-token acceptance, renames")
TYPE_HINT_FILES = tuple(f"vs ar@id:file_edit/type_hints/{m}" for m in ("operator", "colorsys"))
# the type-hint runs' tables, one row per method and run: each file's ratio beside the whole
TYPE_HINT_COLUMNS = ("source", "method", "tok/s", "vs ar", "of floor", *TYPE_HINT_FILES, "ttft", "e2e",
                     "e2e vs ar", "calls/tok", "identical", "done", "plans")
TYPE_HINT_HEADERS = tuple((c, c.rsplit("/", 1)[-1]) for c in TYPE_HINT_FILES)
FSTRING_FILES = tuple(f"vs ar@id:file_edit/fstring/{m}" for m in ("email.quoprimime", "calendar"))
README_COLUMNS = ("method", "decode", "vs ar", "ttft", "e2e", "e2e vs ar", "done?", "fields?", "fields rest?")
SEALED_COLUMNS = ("method", "decode", "vs ar", "ttft", "e2e tok/s", "e2e tok vs ar", "calls/tok", "identical",
                  "done?")
FIRST_USE = ("bench-results-first-use-edits.json", "bench-results-first-use-xeon.json")
FIRST_USE_LABELS = ("EPYC, empty cost cache", "Xeon, costs learned before")


@dataclass(frozen=True)
class Table:
    """Rows of bench.json file(s) in results/. With several files the rows go file by file,
    each file's rows its own (ratios against its own `ar`), named in the `source` column."""

    file: str | tuple[str, ...]
    methods: tuple[str, ...] = ()  # rows to show, in order, those a file has (default: every row)
    workload: str | None = None  # the rows of this selection (see the module's docstring) instead of all
    names: tuple[tuple[str, str], ...] = ()  # method -> how the row is named
    columns: tuple[str, ...] = README_COLUMNS
    headers: tuple[tuple[str, str], ...] = ()  # column -> its header, where not the default
    labels: tuple[str, ...] = ()  # one per file: its rows' `source` cell

    @property
    def files(self) -> tuple[str, ...]:
        return (self.file,) if isinstance(self.file, str) else self.file


@dataclass(frozen=True)
class Curves:
    """A bench.json's cost table: ms per call of n tokens (after 64 tokens of context), one row per
    model and kind of call (`last`: the last row's logits, `all`: every row's)."""

    file: str
    rows: tuple[tuple[str, str, str], ...]  # (model: target or draft, last or all, how the row is named)
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Depths:
    """A bench.json's cost table after d tokens of context: one token / 32 / 64 tokens with
    every row, ms per call (ms per row)."""

    file: str
    names: tuple[tuple[str, str], ...] = (("target", "target"), ("draft", "draft"))


@dataclass(frozen=True)
class Trial:
    """results/edit-verifier-trial.json: (scorer, setting, how the row is named) per row; a
    setting `code presets` shows every preset, `code presets:P` one, another setting its two
    held-out halves."""

    file: str
    rows: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class Agents:
    """An agents.json (`bench --agents`): one row per server and aider edit format, the user's
    wall time over both turns of every file against the fastest llama-server row's."""

    file: str


@dataclass(frozen=True)
class Session:
    """A session.json (`bench --session`): aider over several turns in one git repository through
    each server. One row per pass and server (the session summed; its wait and prompt tokens
    read against the baseline row's of the same pass), or, `turns=True`, one row per pass and
    turn with a group of columns per server."""

    file: str
    turns: bool = False


@dataclass(frozen=True)
class Network:
    """An rpc.json (`bench --rpc-delays`): each row at each delay, its speed against `ar` at the
    same delay (`methods`: the rows to show, in order)."""

    file: str
    methods: tuple[str, ...]
    workload: str  # what the prompts were, for the caption


@dataclass(frozen=True)
class Bounds:
    """`tools/replay.py bounds --out` files, their rows one after another."""

    files: tuple[str, ...]


NETWORK_ROWS = ("ar", "sd", "lookup", "sprinter:balanced", "auto", "llama-server", "llama-server-ngram-mod",
                "llama-server-draft-tuned")
TABLES: dict[str, Table | Curves | Depths | Trial | Bounds | Agents | Network | Session] = {
    # docs/results.md: the current tables
    "fresh-prompts": Table("bench-results-fresh-s7-long-calls.json"),
    "function-edits": Table("bench-results-edits-long-calls.json"),
    "file-edits": Table("bench-results-file-edits-long-calls.json",
                        names=(("llama-server-ngram-mod", "llama.cpp server, ngram-mod"),)),
    "file-edits-report-xeon": Table(
        ("bench-results-file-edits-report-type-hints.json",
         "bench-results-file-edits-report-type-hints-md.json",
         "bench-results-file-edits-report-fstrings.json",
         "bench-results-file-edits-report-kinds-xeon.json"),
        methods=("ar", "auto", "llama-server-ngram-mod", "llama-server-draft-tuned"),
        labels=("type hints (2 files)", "type hints, second run", "f-strings (2)",
                "renames, docstrings, reformats (6)"),
        columns=("source", "method", "decode", "vs ar", "of floor", "ttft", "e2e", "e2e vs ar",
                 "identical", "done?")),
    "agents": Agents("agents-report.json"),
    "agents-reversed": Agents("agents-report-reversed.json"),
    "agents-to-exit": Agents("agents-report-to-exit.json"),
    "session": Session("session-report.json"),
    "session-turns": Session("session-report.json", turns=True),
    "rpc-fresh": Network("rpc-fresh.json", NETWORK_ROWS,
                         "3 HumanEval prompts and 2 chat prompts, 160 tokens"),
    "rpc-files": Network("rpc-files.json", NETWORK_ROWS, "1 whole-file edit of the report split"),
    # docs/results.md and the README: the sealed set, run once on finished code
    "sealed-files": Table(("bench-results-sealed-files.json", "bench-results-sealed-files-11-14.json"),
                          labels=("tasks 1-10", "tasks 11-14"), columns=("source", *SEALED_COLUMNS)),
    "sealed-prompts": Table("bench-results-sealed-prompts.json", columns=SEALED_COLUMNS),
    "fresh-2": Table("bench-results-fresh-2.json", columns=SEALED_COLUMNS),
    "structured": Table("bench-results-structured-30-clean.json",
                        names=(("llama-server", "llama.cpp server, json_schema"),)),
    "first-use-edits": Table("bench-results-first-use-edits.json", workload="edit"),
    "first-use-fresh": Table("bench-results-first-use-edits.json", workload="chat"),
    # docs/results.md: the same tasks on both machines (the Xeon's run not from an empty cost cache)
    "function-edits-machines": Table(FIRST_USE, workload="edit", labels=FIRST_USE_LABELS,
                                     columns=("source", *README_COLUMNS)),
    "fresh-machines": Table(FIRST_USE, workload="chat", labels=FIRST_USE_LABELS,
                            columns=("source", *README_COLUMNS)),
    "first-use-before-edits": Table("bench-results-first-use-before.json", workload="edit"),
    "first-use-before-fresh": Table("bench-results-first-use-before.json", workload="chat"),
    # docs/journal.md: fresh prompts
    "fresh-s7": Table(
        "bench-results-fresh-s7.json",
        columns=("method", "vs ar@id:fresh-code/", "vs ar@id:fresh-chat/", "vs ar", "plans"),
        headers=(("vs ar@id:fresh-code/", "fresh code (5)"), ("vs ar@id:fresh-chat/", "chat (5)"),
                 ("vs ar", "all"))),
    "fresh-workloads": Table(
        "bench-results-fresh.json",
        columns=("method", "vs ar@humaneval", "vs ar@chat", "vs ar@long", "ttft@long", "plans"),
        headers=(("vs ar@humaneval", "fresh code (HumanEval)"), ("vs ar@chat", "chat + explanation"),
                 ("vs ar@long", "long context (quote a pasted module)"),
                 ("ttft@long", "time to first token, long context"))),
    "he6-every-method": Table(
        "bench-results.json",
        columns=("method", "tok/s", "vs ar", "pred", "flat", "calls/tok", "run len", "time split", "done",
                 "rouge", "exact", "logprob", "eta", "tv"),
        names=(("auto", "`auto` (kept `ar`, see below)"), ("sd", "`sd` (k = 4)"),
               ("sprinter@0.46", "`sprinter@0.46` (fast)"), ("sprinter@0.74", "`sprinter@0.74` (balanced)"),
               ("sprinter@0.9", "`sprinter@0.9` (quality)"))),
    "he6-auto-priors": Table(
        "bench-results-auto.json",
        columns=("method", "tok/s", "vs ar", "calls/tok", "plans", "done", "exact", "eta", "tv"),
        names=(("sd", "`sd` (k = 4)"), ("sprinter@0.74", "`sprinter@0.74` (balanced)"))),
    "he6-xeon": Table(
        "bench-results-xeon.json",
        columns=("method", "tok/s", "vs ar", "pred", "flat", "calls/tok", "kept", "run len", "time split",
                 "done", "rouge", "exact", "logprob", "eta", "tv"),
        names=(("sprinter@0.56", "`sprinter@0.56` (fast)"),
               ("sprinter@0.78", "`sprinter@0.78` (then the default)"),
               ("sprinter@0.9", "`sprinter@0.9` (quality)"))),
    # edits of single functions
    "edits-fresh-amx": Table(
        "bench-results-edits-fresh-amx.json",
        columns=("method", "tok/s@edit", "vs ar@edit", "done@edit", "ttft@edit", "plans@edit",
                 "tok/s@chat", "vs ar@chat", "ttft@chat", "plans@chat"),
        headers=(("tok/s@edit", "edits: tok/s"), ("vs ar@edit", "vs `ar`"), ("done@edit", "edits done"),
                 ("ttft@edit", "time to first token"), ("plans@edit", "plans run"),
                 ("tok/s@chat", "fresh prompts: tok/s"), ("vs ar@chat", "vs `ar`"),
                 ("ttft@chat", "time to first token"), ("plans@chat", "plans run"))),
    "edits-anchors": Table(
        "bench-results-edits.json",
        columns=("method", "tok/s", "vs ar", "calls/tok", "done", "done ci", "diff", "plans"),
        names=(("sprinter:quality", "`sprinter`, quality preset (approximate)"),
               ("sprinter:balanced", "`sprinter`, balanced preset (approximate)"))),
    "edits-heldout": Table(
        "bench-results-edits-heldout.json",
        methods=("ar", "auto", "lookup", "llama-server-ngram-simple", "llama-server-ngram-mod"),
        columns=("method", "tok/s", "vs ar", "calls/tok", "done", "diff", "plans")),
    "edits-40-49": Table(
        "bench-results-edits-40-49.json",
        columns=("method", "tok/s", "vs ar", "calls/tok", "done", "plans")),
    # edits of whole files
    "file-edits-report": Table(
        "bench-results-file-edits-report.json",
        columns=REPORT_COLUMNS, headers=edit_headers(REPORT_EDITS)),
    "file-edits-report-10": Table(
        "bench-results-file-edits-report-10.json",
        columns=REPORT_COLUMNS, headers=edit_headers(REPORT_EDITS)),
    "file-edits-report-10-before": Table(
        "bench-results-file-edits-report-10-before.json",
        columns=REPORT_COLUMNS, headers=edit_headers(REPORT_EDITS)),
    "file-edits-report-10-ar-probe": Table(
        "bench-results-file-edits-report-10-ar-probe.json",
        columns=REPORT_COLUMNS, headers=edit_headers(REPORT_EDITS)),
    "file-edits-report-10-anchors": Table(
        "bench-results-file-edits-report-10-anchors.json",
        columns=REPORT_COLUMNS, headers=edit_headers(REPORT_EDITS)),
    "file-edits-report-10-flash-attn-off": Table(
        "bench-results-file-edits-report-10-flash-attn-off.json",
        columns=(*REPORT_COLUMNS, "identical"), headers=edit_headers(REPORT_EDITS)),
    "file-edits-report-10-align": Table(
        "bench-results-file-edits-report-10-align.json",
        columns=(*REPORT_COLUMNS, "identical", RENAME_COPIES),
        headers=(*edit_headers(REPORT_EDITS), RENAME_COPIES_HEADER)),
    "file-edits-report-10-layout": Table(
        "bench-results-file-edits-report-10-layout.json",
        columns=(*REPORT_COLUMNS, "identical", RENAME_COPIES),
        headers=(*edit_headers(REPORT_EDITS), RENAME_COPIES_HEADER)),
    "file-edits-report-renames-prose": Table(
        "bench-results-file-edits-report-renames-prose.json",
        columns=("method", "tok/s", "vs ar", "ttft", "e2e", "e2e vs ar", "calls/tok", "identical",
                 RENAME_COPIES),
        headers=((RENAME_COPIES, "copied-token acceptance"),)),
    "file-edits-report-type-hints": Table(
        ("bench-results-file-edits-report-type-hints.json",
         "bench-results-file-edits-report-type-hints-md.json"),
        labels=("first run", "second run"),
        columns=TYPE_HINT_COLUMNS, headers=TYPE_HINT_HEADERS),
    "type-hints-epyc-zen3": Table(
        ("bench-results-type-hints-epyc-zen3-before.json",
         "bench-results-type-hints-epyc-zen3.json",
         "bench-results-type-hints-epyc-zen3-again.json"),
        labels=("before", "after", "after, again"),
        columns=TYPE_HINT_COLUMNS, headers=TYPE_HINT_HEADERS),
    "file-edits-report-fstrings": Table(
        "bench-results-file-edits-report-fstrings.json",
        columns=("method", "tok/s", "vs ar", "of floor", *FSTRING_FILES, "ttft", "e2e", "e2e vs ar",
                 "calls/tok", "identical", "done", "plans"),
        headers=tuple((c, c.rsplit("/", 1)[-1]) for c in FSTRING_FILES)),
    "file-edits-report-kinds-xeon": Table(
        "bench-results-file-edits-report-kinds-xeon.json",
        columns=("method", "tok/s", "vs ar", "of floor", *edit_columns(KIND_EDITS), "ttft", "e2e",
                 "e2e vs ar", "calls/tok", "identical", RENAME_COPIES, "done", "plans"),
        headers=(*edit_headers(KIND_EDITS), RENAME_COPIES_HEADER)),
    "splice-smoke": Table(
        "bench-results-splice-report-smoke.json",
        columns=("method", "tok/s", "vs ar", "ttft", "e2e", "e2e vs ar", "calls/tok", "cost model", "done")),
    "weave-trial": Table(
        ("bench-results-weave-tuning-first.json", "bench-results-weave-tuning-anchor.json"),
        names=(("weave", "trial"),), labels=("one-token re-anchor", "two-token re-anchor"),
        columns=("source", "method", "tok/s", "vs ar", "ttft", "e2e", "calls/tok", "time split", "done")),
    "flash-attn": Table(
        ("bench-results-flash-attn-on.json", "bench-results-flash-attn-off.json"),
        labels=("flash attention on", "off (the default)"),
        columns=("source", "method", "tok/s", "vs ar", *edit_columns(SWEEP_EDITS),
                 "ttft", "e2e", "e2e vs ar", "calls/tok", "identical", "done"),
        headers=edit_headers(SWEEP_EDITS)),
    "anchor-sweep": Table(
        "bench-results-anchor-sweep.json",
        columns=("method", "tok/s", "vs ar", "ttft", "calls/tok", "draft acc", "done")),
    "file-edit-sweep": Table(
        "bench-results-file-edit-sweep.json",
        columns=("method", "tok/s", "vs ar", *edit_columns(SWEEP_EDITS), "ttft",
                 "calls/tok", "draft acc", "done"),
        headers=edit_headers(SWEEP_EDITS)),
    "file-edits-long-calls": Table(
        "bench-results-file-edits-long-calls.json",
        columns=("method", "tok/s", "vs ar", "ttft", "e2e", "e2e vs ar", "calls/tok", "cost model", "done",
                 "identical", "plans")),
    "file-edits-prediction": Table(
        "bench-results-file-edits.json",
        columns=("method", "tok/s", "vs ar", "ttft", "e2e", "e2e vs ar", "calls/tok", "cost model", "done",
                 "identical", "plans")),
    # structured output
    "structured-30-clean": Table(
        "bench-results-structured-30-clean.json",
        columns=("method", "done", "fields", "fields rest", "forced", "decode", "vs ar", "ttft", "e2e",
                 "e2e vs ar", "plans"),
        names=(("llama-server", "llama.cpp server, `json_schema`"),)),
    "structured-12-after": Table(
        "bench-results-structured-12-after.json",
        columns=("method", "done", "fields", "fields rest", "forced", "decode", "vs ar", "ttft", "e2e",
                 "e2e vs ar", "plans")),
    "structured-compact": Table(
        ("bench-results-structured-12-after.json", "bench-results-structured-12-compact.json"),
        labels=("the model's own (pretty-printed)", "compact"),
        columns=("source", "method", "tokens/prompt", "forced", "decode s/prompt", "decode", "vs ar",
                 "fields", "fields rest"),
        headers=(("source", "layout"),)),
    "structured-30": Table(
        "bench-results-structured-30.json",
        columns=("method", "done", "cut", "fenced", "fields", "fields rest", "forced", "tok/s@from:5",
                 "vs ar@from:5", "plans"),
        headers=(("tok/s@from:5", "tok/s, tasks 6-30"), ("vs ar@from:5", "vs `ar`, tasks 6-30")),
        names=(("ar+free", "`ar+free` (no schema)"), ("llama-server", "llama.cpp server, `json_schema`"))),
    # HumanEval quality
    "he80": Table(
        "bench-results-he80.json",
        columns=("method", "tok/s", "vs ar", "pred", "flat", "calls/tok", "run len", "time split", "done",
                 "done ci", "diff", "exact", "plans")),
    # SPRINTER and its verifiers
    "sprinter-presets": Table(
        ("bench-results-he80.json", "bench-results-edits.json", "bench-results-edits-fast.json",
         "bench-results-edit-threshold.json"),
        methods=("sprinter:quality", "sprinter:balanced", "sprinter:fast", "sprinter@0.9766"),
        labels=("HumanEval 0-79 (presets 0.90 / 0.82 / 0.58)", "edit tasks 0-19", "edit tasks 0-19",
                "held-out edit tasks 20-39 (an `edit` threshold picked on tasks 0-19)"),
        columns=("source", "method", "done", "diff", "vs ar"),
        headers=(("source", "tasks"), ("method", "row"), ("done", "passed"))),
    "edit-verifier-trial": Trial("edit-verifier-trial.json", rows=(
        ("shipped logits verifier", "code presets",
         "shipped max-prob verifier, code presets quality / balanced / fast"),
        ("shipped logits verifier", NO_FALSE_PASS,
         "**shipped verifier, an `edit` threshold: no false pass on the fit half**"),
        ("shipped + copy features (logreg)", NO_FALSE_PASS,
         "verifier score + confidence + copy features (logistic regression), no false pass on the fit half"),
        ("shipped + copy features (logreg)", "flag 25%", "... same, a 25% flag budget"),
        (HIDDEN_ON_EDITS, NO_FALSE_PASS,
         "hidden state + copy features, trained on edit trajectories (logistic regression), "
         "no false pass on the fit half"),
        (HIDDEN_ON_EDITS, "flag 25%", "... same, a 25% flag budget"),
        ("shipped hidden-state verifier", NO_FALSE_PASS,
         "shipped hidden-state verifier, no false pass on the fit half"),
        ("guard (shipped, every drafted copy flagged)", "code presets:quality",
         "the guard (every drafted copy flagged) on the quality preset"),
    )),
    "verifiers-end-to-end": Table(
        ("bench-results-verifiers-greedy.json", "bench-results-verifiers-t0.7.json"),
        labels=("0", "0.7"),
        columns=("source", "method", "tok/s", "vs ar", "ttft", "calls/tok", "eta", "tv", "fp mass",
                 "verifier ms", "done"),
        headers=(("source", "T"),),
        names=(("sprinter:balanced[auto]", "rule (`auto`)"), ("sprinter:balanced[hidden]", "hidden"))),
    "bounds-type-hints-epyc-zen3": Bounds(("replay-bounds-type-hints-epyc-zen3.json",)),
    "bounds-report-xeon": Bounds(("replay-bounds-type-hints-xeon.json", "replay-bounds-fstrings-xeon.json",
                                  "replay-bounds-kinds-xeon.json")),
    # cost curves
    "costs-at-depth": Depths("bench-results-file-edits-long-calls.json"),
    "curves-epyc-zen3": Curves("bench-results.json", sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), rows=(
        ("target", "last", "target 1.5B Q4_K_M, last row"), ("target", "all", "target 1.5B Q4_K_M, all rows"),
        ("draft", "last", "draft 0.5B Q4_0/head Q4_0, last row"))),
    "curves-xeon-amx": Curves("bench-results-xeon.json", sizes=(1, 2, 4, 8, 16, 32), rows=(
        ("target", "last", "target 1.5B, last row"), ("target", "all", "target 1.5B, all rows"),
        ("draft", "last", "draft 0.5B Q4_K_M, last row"), ("draft", "all", "draft 0.5B Q4_K_M, all rows"))),
}


# ---------------------------------------------------------------------------------------------
# results/README.md and the raw files


def index() -> dict[str, tuple[str, str, str]]:
    """results/README.md's lines: file -> (date, machine, command)."""
    out = {}
    for line in (RESULTS / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("`") and cells[0].endswith("`"):
            out[cells[0].strip("`")] = (cells[2], cells[3], cells[4])
    return out


@functools.cache
def load(file: str) -> dict:
    """A raw file of results/ (read once: the renderers do not change what they read)."""
    return json.loads((RESULTS / file).read_text(encoding="utf-8"))


def caption_command(data: dict, file: str, where: dict[str, tuple[str, str, str]]) -> str:
    """The run's command as a user types it: paths inside the checkout relative to it, the
    progress and output flags left out. A file without a `command` has the one of its line in
    results/README.md."""
    command = data.get("command") if isinstance(data, dict) else None
    if not command:
        return where[file][2].strip("`")
    command = command.split(" --out ")[0].replace(" --no-progress", "")
    command = re.sub(r"\S*/(results/[\w.-]+)", r"\1", command)  # a path inside the checkout
    for old, new in RENAMED.items():
        command = command.replace(old, new)
    return command


def caption(file: str, what: str, where: dict[str, tuple[str, str, str]], data: dict) -> str:
    if file not in where:
        raise SystemExit(f"results/{file} has no line in results/README.md: add one (date, machine)")
    date, machine, _ = where[file]
    return (f"{date}, {machine}, {what}, from [results/{file}](results/{file}): "
            f"`{caption_command(data, file, where)}`")


# ---------------------------------------------------------------------------------------------
# rows: a file's summary rows, a group's, or rows recomputed from a selection of its runs


def prompt_order(data: dict) -> list[str]:
    seen: dict[str, None] = {}
    for run in data.get("runs", []):
        seen.setdefault(run["prompt_id"], None)
    return list(seen)


def selected_runs(data: dict, sel: str) -> list[dict]:
    if sel.startswith("id:"):
        return [r for r in data["runs"] if r["prompt_id"].startswith(sel[3:])]
    if sel.startswith("from:"):
        keep = set(prompt_order(data)[int(sel[5:]):])
        return [r for r in data["runs"] if r["prompt_id"] in keep]
    return [r for r in data["runs"] if (r.get("workload") or r.get("prompt_kind")) == sel]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def recomputed_rows(data: dict, sel: str) -> list[SummaryRow]:
    """Summary rows over the runs of a selection, as the bench computes them (tok/s: tok/s of
    each run weighted by its decode time; time to first token: the engine's time to the first
    token, a peer's prompt time; end to end: the mean of the runs' total time)."""
    by: dict[str, list[dict]] = {}
    for run in selected_runs(data, sel):
        by.setdefault(run["method"], []).append(run)
    if not by:
        raise SystemExit(f"no runs in the selection {sel!r}")
    rows: list[SummaryRow] = []
    for method, runs in by.items():
        dec = sum(r["decode_seconds"] for r in runs)
        stats = [r["stats"] for r in runs if r.get("stats")]
        ttft = [s.get("first_token_seconds", s.get("prefill_seconds")) for s in stats]
        timed = sum(r["tokens_per_second"] * r["decode_seconds"] for r in runs)
        rows.append({"method": method, "prompts": len(runs), "new_tokens": sum(r["new_tokens"] for r in runs),
                     "tokens_per_second": timed / dec if dec else 0.0,
                     "ttft_seconds": _mean([t for t in ttft if t is not None]),
                     "e2e_seconds": _mean([s["total_seconds"] for s in stats if s.get("total_seconds")])})
    ar = next((r for r in rows if r["method"] == "ar"), None)
    for r in rows:
        r["ratio_vs_ar"] = r["tokens_per_second"] / ar["tokens_per_second"] if ar else None
    return rows


def summary_rows(data: dict, sel: str | None) -> list[SummaryRow]:
    """The rows `sprinter-edge bench` summarised (bench.json "rows", or a workload's "groups"),
    or rows recomputed from a selection of its runs."""
    if sel is None:
        return data["rows"]
    if sel in data.get("groups", {}):
        return data["groups"][sel]
    return recomputed_rows(data, sel)


def runs_of(data: dict, method: str, sel: str | None) -> list[dict]:
    runs = data.get("runs", []) if sel is None else selected_runs(data, sel)
    return [r for r in runs if r["method"] == method]


# ---------------------------------------------------------------------------------------------
# columns: (header, cell) from a row, the file it is of and the selection the column names


@dataclass
class Cell:
    row: dict | None  # the method's row in the column's selection (None: the method has none there)
    data: dict
    sel: str | None
    label: str  # the row's file's label (its `source` cell)
    name: str  # how the row is named

    def ar(self) -> dict | None:
        return next((r for r in summary_rows(self.data, self.sel) if r["method"] == "ar"), None)

    def get(self, key: str) -> float | None:
        return None if self.row is None else self.row.get(key)

    def runs(self) -> list[dict]:
        return [] if self.row is None else runs_of(self.data, self.row["method"], self.sel)


def _num(fmt: str) -> Callable[[float | None], str]:
    return lambda x: "-" if x is None else fmt.format(x)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


CHECKS = (("file_edit_n", "file_edit", "file_edit_pass", "edits done"),
          ("edit_n", "edit", "edit_pass", "edits done"),
          ("structured_n", "structured", "structured_valid", "schema-valid"),
          ("humaneval_n", "pass", "pass_at_1", "pass@1"))


def _check(row: dict | None) -> tuple[str, str, str, int] | None:
    """The task-level check the row ran: (its row keys' prefix, its rate key, header, tasks)."""
    for n_key, prefix, rate, header in CHECKS:
        n = (row or {}).get(n_key) or 0
        if n:
            return prefix, rate, header, n
    return None


def _done(c: Cell) -> str:
    check = _check(c.row)
    if not check or c.row.get(check[1]) is None:
        return "-"
    return f"{round(c.row[check[1]] * check[3])}/{check[3]}"


def _done_ci(c: Cell) -> str:
    check = _check(c.row)
    ci = c.row.get(f"{check[0]}_ci") if check else None
    return "-" if not ci else f"{ci[0]:.2f}-{ci[1]:.2f}"


def _diff(c: Cell) -> str:
    check = _check(c.row)
    diff = c.row.get(f"{check[0]}_diff_vs_ar") if check else None
    if diff is None:
        return "-"
    lo, hi = c.row.get(f"{check[0]}_diff_ci") or (None, None)
    ci = "" if lo is None else f" [{lo * 100:+.1f}, {hi * 100:+.1f}]"
    return f"{diff * 100:+.1f}{ci}"


def _e2e_ratio(c: Cell) -> str:
    ar, e2e = c.ar(), c.get("e2e_seconds")
    return _ratio(ar["e2e_seconds"] / e2e if ar and e2e and ar.get("e2e_seconds") else None)


def _e2e_per_token(runs: list[dict]) -> float | None:
    """Tokens per second from request to last token over `runs`, every prompt's reading included."""
    seconds = sum((r.get("stats") or {}).get("total_seconds") or 0.0 for r in runs)
    return sum(r["new_tokens"] for r in runs) / seconds if seconds else None


def _e2e_tps(c: Cell) -> str:
    return _num("{:.1f} tok/s")(_e2e_per_token(c.runs()))


def _e2e_tps_ratio(c: Cell) -> str:
    mine = _e2e_per_token(c.runs())
    ar = _e2e_per_token(runs_of(c.data, "ar", c.sel))
    return _ratio(mine / ar if mine and ar else None)


def _cost_model(c: Cell) -> str:
    pred, tps = c.get("predicted_tps"), c.get("tokens_per_second")
    return "-" if pred is None or not tps else f"{pred:.2f} ({pred / tps - 1:+.0%})"


def _identical(c: Cell) -> str:
    if c.row is None or c.row["method"] == "ar" or c.get("exact_match") is None:
        return "-"
    return f"{round(c.row['exact_match'] * c.row['prompts'])}/{c.row['prompts']}"


def _time_split(c: Cell) -> str:
    split = c.get("time_split")
    if not split:
        return "-"
    return "/".join(f"{split[k] * 100:.0f}" for k in ("draft", "target", "verifier", "overhead"))


def _run_length(c: Cell) -> str:
    x = c.get("mean_run_length")
    return "-" if not x else f"{x:.1f}"


def _tv(c: Cell) -> str:
    """TV drift per token; a greedy run older than the column: false passes over its tokens
    (under greedy decoding the same quantity, up to the near-ties the one-batch rescoring moves)."""
    x = c.get("tv_drift")
    if x is None and c.get("false_passes") is not None and not c.data["config"].get("temperature"):
        x = c.row["false_passes"] / c.row["new_tokens"]
    return _num("{:.4f}")(x)


def _floor(data: dict, sel: str | None) -> float | None:
    """The floor's ratio over ar on the selection's ar replies, priced from the file's cost
    table by the package's own cost model (sprinter_edge/bench/costmodel.py)."""
    if not data.get("cost_model"):
        return None
    sys.path.insert(0, str(ROOT))
    from sprinter_edge.bench.costmodel import CostModel

    ar = [r["stats"] for r in runs_of(data, "ar", sel) if r.get("stats")]
    return CostModel.from_dict(data["cost_model"]).floor_ratio(
        [(s["prompt_tokens"], s["new_tokens"]) for s in ar])


def _of_floor(c: Cell) -> str:
    """vs ar over the floor's ratio: the bench's own figure, or, for a run older than it, the
    floor priced here from the file's cost table."""
    x = c.get("of_floor")
    if x is None and c.get("ratio_vs_ar") is not None:
        floor = _floor(c.data, c.sel)
        x = c.row["ratio_vs_ar"] / floor if floor else None
    return "-" if x is None else f"{x:.0%}"


def _verifier_ms(c: Cell) -> str:
    stats = [r["stats"] for r in c.runs() if r.get("stats")]
    drafted = sum(s.get("draft_tokens", 0) for s in stats)
    seconds = sum(s.get("verifier_seconds", 0.0) for s in stats)
    return "-" if not drafted or not seconds else f"{seconds / drafted * 1000:.2f}"


def _plans(c: Cell) -> str:
    """What `auto` ran, prompt by prompt: each sequence of plans and on how many prompts."""
    base = None if c.row is None else c.row.get("base_method") or c.row.get("kind") or c.row["method"]
    if base is None or base.split("+")[0] != "auto":
        return "-"
    seen = Counter()
    for run in c.runs():
        stats = run.get("stats") or {}
        plans = stats.get("plans_run") or ([stats["plan"]] if stats.get("plan") else [])
        seen[" then ".join(f"`{p}`" for p in plans) or "?"] += 1
    return ", ".join(f"{plans} {n}" for plans, n in seen.most_common())


def field_accuracy(data: dict, method: str) -> tuple[float, float] | None:
    """A row's structured field accuracy from its runs: over every truth field, and over the
    fields other than COPIED_FIELDS (a reply with no JSON counts every field wrong)."""
    right_all = n_all = right_rest = n_rest = 0
    for run in data.get("runs", []):
        check = run.get("structured")
        if run.get("method") != method or not check or check.get("accuracy") is None:
            continue
        fields = check.get("fields")
        if fields is None:  # truth but no JSON read: every field wrong
            fields = dict.fromkeys(STRUCTURED_FIELDS, False)
        for name, ok in fields.items():
            right_all += bool(ok)
            n_all += 1
            if name not in COPIED_FIELDS:
                right_rest += bool(ok)
                n_rest += 1
    return (right_all / n_all, right_rest / n_rest) if n_all and n_rest else None


def _fields(which: int) -> Callable[[Cell], str]:
    def cell(c: Cell) -> str:
        acc = field_accuracy(c.data, c.row["method"]) if c.row and c.row.get("structured_truth_n") else None
        return "-" if acc is None else f"{acc[which]:.2f}"
    return cell


def _decode_per_prompt(c: Cell) -> str:
    return _num("{:.1f}")(_mean([r["decode_seconds"] for r in c.runs()]))


def _copy_acceptance(c: Cell) -> str:
    """Of the tokens the method's copies proposed, the share the target accepted (its runs'
    counters together; "-" for a method that counts no copies, as llama.cpp's)."""
    stats = [r.get("stats") or {} for r in c.runs()]
    proposed = sum(s.get("copied_tokens") or 0 for s in stats)
    return "-" if not proposed else f"{sum(s.get('copied_accepted') or 0 for s in stats) / proposed:.2f}"


def _key(key: str, fmt: Callable[[float | None], str]) -> Callable[[Cell], str]:
    return lambda c: fmt(c.get(key))


_without = " and ".join(f"`{f}`" for f in COPIED_FIELDS)
COLUMNS: dict[str, tuple[str, Callable[[Cell], str]]] = {
    "source": ("run", lambda c: c.label),
    "method": ("method", lambda c: c.name),
    "decode": ("decode", _key("tokens_per_second", _num("{:.1f} tok/s"))),
    "tok/s": ("tok/s", _key("tokens_per_second", _num("{:.2f}"))),
    "vs ar": ("vs `ar`", _key("ratio_vs_ar", _ratio)),
    "ttft": ("time to first token", _key("ttft_seconds", lambda x: "-" if not x else f"{x:.1f} s")),
    "e2e": ("end to end, per prompt", _key("e2e_seconds", lambda x: "-" if not x else f"{x:.1f} s")),
    "e2e vs ar": ("e2e vs `ar`", _e2e_ratio),
    "e2e tok/s": ("end to end, per token", _e2e_tps),
    "e2e tok vs ar": ("end to end vs `ar`", _e2e_tps_ratio),
    "of floor": ("of this CPU's floor", _of_floor),
    "done": ("task check", _done),  # the header is the check's: edits done, schema-valid, pass@1
    "done ci": ("95% CI (Wilson)", _done_ci),
    "diff": ("vs `ar`, points (paired 95% CI)", _diff),
    "calls/tok": ("target calls / token", _key("target_calls_per_token", _num("{:.3f}"))),
    "draft acc": ("draft acceptance", _key("draft_accept", _num("{:.2f}"))),
    "pred": ("pred tok/s", _key("predicted_tps", _num("{:.2f}"))),
    "cost model": ("cost model, tok/s", _cost_model),
    "flat": ("flat-cost pred", _key("predicted_ratio_flat", _ratio)),
    "kept": ("kept", _key("kept", _num("{:d}"))),
    "run len": ("run len", _run_length),
    "time split": ("time d/t/v/o %", _time_split),
    "rouge": ("ROUGE-L vs `ar`", _key("rouge_l", _num("{:.3f}"))),
    "exact": ("exact vs `ar`", _key("exact_match", _num("{:.2f}"))),
    "identical": ("identical to `ar`", _identical),
    "copy acc": ("copied-token acceptance", _copy_acceptance),
    "logprob": ("tgt logprob/tok", _key("mean_logprob", _num("{:.3f}"))),
    "eta": ("eta_FP", _key("eta_fp", _num("{:.3f}"))),
    "tv": ("TV drift/tok", _tv),
    "fp mass": ("FP mass/tok", _key("fp_mass", _num("{:.4f}"))),
    "verifier ms": ("verifier ms / drafted token", _verifier_ms),
    "forced": ("tokens the grammar gave", _key("forced_share", _num("{:.1%}"))),
    "fields": ("field accuracy", _fields(0)),
    "fields rest": (f"field accuracy without {_without}", _fields(1)),
    "cut": ("cut by length", _key("structured_length", _num("{:d}"))),
    "fenced": ("valid in a code block", _key("structured_fenced", _num("{:d}"))),
    "tokens/prompt": ("tokens a prompt", lambda c: _num("{:.1f}")(c.get("new_tokens") / c.get("prompts"))
                      if c.row else "-"),
    "decode s/prompt": ("decode s a prompt", _decode_per_prompt),
    "plans": ("plans run (`auto`: prompts)", _plans),
}


def _split(spec: str) -> tuple[str, str | None, bool]:
    """A column's spec: (column, selection or None, shown only when some row has a value)."""
    optional = spec.endswith("?")
    name, _, sel = spec.rstrip("?").partition("@")
    if name not in COLUMNS:
        raise SystemExit(f"no column named {name!r} in tools/render_tables.py")
    return name, sel or None, optional


def _row(line: list[str]) -> str:
    return "| " + " | ".join(line) + " |"


def render_table(table: Table, where: dict[str, tuple[str, str, str]]) -> str:
    names = {**NAMES, **dict(table.names)}
    headers = dict(table.headers)
    labels = table.labels or ("",) * len(table.files)
    captions, body = [], []  # body: (cells per column spec) per row
    columns = [_split(spec) for spec in table.columns]
    for file, label in zip(table.files, labels, strict=True):
        data = load(file)
        rows = summary_rows(data, table.workload)
        if table.methods:
            by = {r["method"]: r for r in rows}
            rows = [by[m] for m in table.methods if m in by]
        if not rows:
            raise SystemExit(f"results/{file}: none of the rows {table.methods}")
        for row in rows:
            cells = []
            for name, sel, _ in columns:
                at = row if sel is None else next(
                    (r for r in summary_rows(data, sel) if r["method"] == row["method"]), None)
                cell = Cell(at, data, sel if sel is not None else table.workload, label,
                            names.get(row["method"], f"`{row['method']}`"))
                cells.append((COLUMNS[name][1](cell), at))
            body.append(cells)
        group = f" of the `{table.workload}` group" if table.workload else ""
        text = caption(file, f"{rows[0]['prompts']} prompts{group}", where, data)
        captions.append(f"{label}: {text}" if table.labels else text)
    keep = [i for i, (_, _, optional) in enumerate(columns)
            if not optional or any(row[i][0] != "-" for row in body)]
    header = []
    for i in keep:
        spec, (name, sel, _) = table.columns[i].rstrip("?"), columns[i]
        default = COLUMNS[name][0]
        if name == "done":
            default = next((c[2] for row in body if (c := _check(row[i][1]))), default)
        header.append(headers.get(spec, default if sel is None else f"{default}, {sel}"))
    lines = [_row(header), "|" + "---|" * len(header)]
    lines += [_row([row[i][0] for i in keep]) for row in body]
    return "\n\n".join(captions) + "\n\n" + "\n".join(lines) + "\n"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def render_curves(table: Curves, where: dict[str, tuple[str, str, str]]) -> str:
    data = load(table.file)
    costs = data["cost_model"]
    lines = [_row(["model, rows"] + [f"n={n}" if i == 0 else str(n) for i, n in enumerate(table.sizes)]),
             "|" + "---|" * (len(table.sizes) + 1)]
    for model, rows, name in table.rows:
        curve = costs[model][f"{rows}_row_ms" if rows == "last" else f"{rows}_rows_ms"]
        lines.append(_row([name] + [_ms(curve.get(str(n))) for n in table.sizes]))
    what = "ms per decode call of n tokens after 64 tokens of context (the bench's cost table)"
    text = caption(table.file, what, where, data)
    return text + "\n\n" + "\n".join(lines) + "\n"


def render_depths(table: Depths, where: dict[str, tuple[str, str, str]]) -> str:
    data = load(table.file)
    costs = data["cost_model"]
    depths = ["64"] + sorted(costs["target"].get("after_depth", {}), key=int)

    def cell(model: str, depth: str) -> str:
        curve = costs[model] if depth == "64" else costs[model]["after_depth"][depth]
        one = curve["last_row_ms"].get("1")
        parts = [_ms(one)]
        for n in (32, 64):
            x = curve["all_rows_ms"].get(str(n))
            parts.append("-" if x is None else f"{x:,.0f} ({x / n:.1f})")
        return " / ".join(parts)

    lines = [_row(["model"] + [f"d = {int(d):,}" if i == 0 else f"{int(d):,}" for i, d in enumerate(depths)]),
             "|" + "---|" * (len(depths) + 1)]
    lines += [_row([name] + [cell(model, d) for d in depths]) for model, name in table.names]
    what = ("ms per call after d tokens of context: one token / 32 tokens with every row / 64 with every row "
            "(ms per row), the bench's cost table")
    text = caption(table.file, what, where, data)
    return text + "\n\n" + "\n".join(lines) + "\n"


def render_trial(table: Trial, where: dict[str, tuple[str, str, str]]) -> str:
    data = load(table.file)
    lines = [_row(["scorer", "threshold (picked on the other half)", "tokens flagged",
                   "tasks reproduced (held-out halves)"]), "|---|---|---|---|"]
    for scorer, setting, name in table.rows:
        key, _, preset = setting.partition(":")
        got = data["scorers"][scorer][key]
        if isinstance(got, dict):  # presets: each preset on the whole set
            parts = [got[preset]] if preset else list(got.values())
            tasks = ", ".join(p["tasks_reproduced"] for p in parts)
        else:  # the two held-out halves: their sum
            parts = got
            done = [tuple(int(x) for x in p["tasks_reproduced"].split("/")) for p in parts]
            tasks = f"{sum(k for k, _ in done)}/{sum(n for _, n in done)}"
        lines.append(_row([name, " / ".join(f"{p['threshold']:.5g}" for p in parts),
                           " / ".join(f"{p['flag_share']:.1%}" for p in parts), tasks]))
    what = f"{data['tasks']} edit tasks, {data['tokens']:,} tokens of `ar`'s replies"
    return caption(table.file, what, where, data) + "\n\n" + "\n".join(lines) + "\n"


BOUND_HEADERS = (("measured", "measured"), ("replayed", "the copy replayed"),
                 ("copy3", "copy oracle, 3-gram"), ("copy3+draft", "... + a perfect draft"),
                 ("copy1", "copy oracle, 1-gram"), ("copy1+draft", "... + a perfect draft"))


def render_bounds(table: Bounds, where: dict[str, tuple[str, str, str]]) -> str:
    lines = [_row(["edit kind", "tokens", "floor", *(h for _, h in BOUND_HEADERS)]),
             "|---" * (3 + len(BOUND_HEADERS)) + "|"]
    captions = []
    for file in table.files:
        data = load(file)
        captions.append(caption(file, f"the replies of `ar` to {data['rows'][-1]['tasks']} tasks, "
                                      f"measured: `{data['method']}`", where, data))
        kinds = [r["kind"].replace("_", " ") for r in data["rows"] if r["kind"] != "all"]
        for row in data["rows"]:
            floor = row["floor"]
            name = f"all: {', '.join(kinds)}" if row["kind"] == "all" else row["kind"].replace("_", " ")
            cells = [f"{row[key]:.2f}x ({row[key] / floor:.0%})" if row[key] and floor else "-"
                     for key, _ in BOUND_HEADERS]
            lines.append(_row([name, f"{row['tokens']:,}", f"{floor:.2f}x", *cells]))
    return "\n\n".join(captions) + "\n\n" + "\n".join(lines) + "\n"


AGENT_SERVERS = {"serve:auto": "`sprinter-edge serve` (auto)", "llama-server": "llama.cpp's server, plain",
                 "llama-server-ngram-mod": "llama.cpp's server, ngram-mod",
                 "llama-server-draft-tuned": "llama.cpp's server, `-md` tuned"}


def render_agents(table: Agents, where: dict[str, tuple[str, str, str]]) -> str:
    data = load(table.file)
    exits = all(r.get("exit_seconds") for r in data["summary"])  # recorded since 2026-12-07
    # (before, only the time to aider's exit was recorded, in wall_seconds)
    waited = "command to file written, both turns" if exits else "command to aider's exit, both turns"
    heads = ["server", "edit format", waited, "vs the best llama.cpp server"]
    heads += ["to aider's exit (its chat summary too)", "vs the best"] if exits else []
    heads += ["edits done", "follow-ups done", "prompt tokens read (s)", "tokens written", "decode tok/s"]
    lines = [_row(heads), "|---" * len(heads) + "|"]
    for r in data["summary"]:
        vs = r.get("wall_vs_best_llama_server")
        read = f"{r['prompt_tokens']:,} ({r['prompt_seconds']:.0f} s)"
        exit_cells = [f"{r['exit_seconds']:.1f} s", f"{r['exit_vs_best_llama_server']:.2f}x"
                      if r.get("exit_vs_best_llama_server") else "-"] if exits else []
        lines.append(_row([AGENT_SERVERS.get(r["row"], r["row"]), r["format"], f"{r['wall_seconds']:.1f} s",
                           f"{vs:.2f}x" if vs else "-", *exit_cells, f"{r['turn1_done']}/{r['tasks']}",
                           f"{r['turn2_done']}/{r['tasks']}", read, f"{r['completion_tokens']:,}",
                           f"{r['decode_tokens_per_second']:.1f}"]))
    c, m = data["config"], data["machine"]
    order = ", ".join(AGENT_SERVERS.get(r, r) for r in c["rows"])
    what = (f"aider {m['aider'].split()[-1]} through each server, {c['tasks']} whole-file edits of the "
            f"{c['split']} split, two turns each (the edit, then a follow-up on the same file); one "
            f"server at a time, in this order: {order}")
    return caption(table.file, what, where, data) + "\n\n" + "\n".join(lines) + "\n"


# bench/session.py's REUSE and REUSE_OPTIONS: a llama-server row `CONFIG+reuse` has slot reuse
SESSION_REUSE = ("+reuse", "--cache-reuse 256")


def session_server(row: str) -> str:
    """A session row's name: render_agents' names (`serve:METHOD` and llama-server
    configurations likewise), `CONFIG+reuse` CONFIG's with slot reuse."""
    base = row.removesuffix(SESSION_REUSE[0])
    if base in AGENT_SERVERS:
        name = AGENT_SERVERS[base]
    elif base.startswith("serve:"):
        name = f"`sprinter-edge serve` ({base.removeprefix('serve:')})"
    elif base.startswith("llama-server-"):
        name = f"llama.cpp's server, {base.removeprefix('llama-server-')}"
    else:
        name = f"`{base}`"
    return name if base == row else f"{name}, with `{SESSION_REUSE[1]}`"


def session_what(data: dict, listed: bool = True) -> str:
    """What a session.json ran, for its tables' captions (`listed`: its turns too)."""
    c, m = data["config"], data["machine"]
    turns = ", ".join(f"{p['edit'].replace('_', ' ')} in {', '.join(f'`{f}`' for f in p['files'])}"
                      for p in data["plan"])
    order = ", then ".join(session_server(r) for r in c["rows"])
    formats = ", ".join(f"`{f}`" for f in c["formats"])
    what = (f"aider {m['aider'].split()[-1]} (edit format{'s' * (len(c['formats']) > 1)} {formats}) in a "
            f"fresh git repository of modules of the {data['split']} split, {len(data['plan'])} turns"
            f"{f' ({turns})' if listed else ''}, aider committing each edit, its repository map at its "
            f"default, the chat history restored each turn; each server runs the whole session, one at "
            f"a time: {order}")
    if c["orders"] == "both":
        what += "; pass 2 the same in reverse"
    return what + "".join(f"; note: {n}" for n in data.get("notes", []))


def render_session(table: Session, where: dict[str, tuple[str, str, str]]) -> str:
    data = load(table.file)
    body = _session_turns(data) if table.turns else _session_rows(data)
    return caption(table.file, body[0], where, data) + "\n\n" + "\n".join(body[1]) + "\n"


def _session_rows(data: dict) -> tuple[str, list[str]]:
    """One row per pass, server and format: the session's totals, against the baseline's."""
    rows = data["summary"]
    passes = len({r["order"] for r in rows}) > 1
    formats = len(data["config"]["formats"]) > 1
    heads = (["pass"] * passes + ["server"] + ["edit format"] * formats
             + ["turns written", "to files written, the turns both it and the baseline wrote",
                "vs the baseline", "to aider's exit, every turn", "edits done", "prompt tokens read (s)",
                "reused", "read vs the baseline", "tokens written", "requests"])
    lines = [_row(heads), "|---" * len(heads) + "|"]
    for r in rows:
        common = (f"{r['common_wall_seconds']:.1f} s ({r['common_turns']} turns)"
                  if r.get("common_turns") and r.get("wall_vs_baseline") is not None else "-")
        lines.append(_row([str(r["order"])] * passes + [session_server(r["row"])] + [r["format"]] * formats
                          + [f"{r['written']}/{r['turns']}", common, _ratio(r.get("wall_vs_baseline")),
                             f"{r['exit_seconds']:.1f} s", f"{r['done']}/{r['turns']}",
                             f"{r['prompt_tokens']:,} ({r['prompt_seconds']:.0f} s)",
                             f"{r['cached_tokens']:,}", _ratio(r.get("prompt_vs_baseline")),
                             f"{r['completion_tokens']:,}", f"{r['requests']:,}"]))
    base = data["config"]["baseline"]
    against = (f"ratios against {session_server(base)} (the baseline) in the same pass"
               if base in data["config"]["rows"]
               else f"no ratios (the baseline, {session_server(base)}, did not run)")
    return f"{session_what(data)}; the waits from the command, summed over the turns, {against}", lines


def _session_turns(data: dict) -> tuple[str, list[str]]:
    """One row per pass, format and turn; per server its wait to the files written, the prompt
    tokens it read and reused, the tokens written and whether the edit was done."""
    c, turns = data["config"], data["turns"]
    servers = [s for s in c["rows"] if any(t["row"] == s for t in turns)]
    at = {(t["order"], t["edit_format"], t["turn"], t["row"]): t for t in turns}
    keys = sorted({k[:3] for k in at}, key=lambda k: (k[0], c["formats"].index(k[1]), k[2]))
    passes = len({k[0] for k in keys}) > 1
    formats = len(c["formats"]) > 1
    heads = ["pass"] * passes + ["edit format"] * formats + ["turn", "edit", "files"]
    for s in servers:
        heads += [f"{session_server(s)}: to files written", "prompt read / reused", "tokens written", "done"]
    lines = [_row(heads), "|---" * len(heads) + "|"]
    for order, fmt, n in keys:
        first = next(at[(order, fmt, n, s)] for s in servers if (order, fmt, n, s) in at)
        cells = ([str(order)] * passes + [fmt] * formats
                 + [str(n), first["edit"].replace("_", " "), ", ".join(f"`{f}`" for f in first["files"])])
        for s in servers:
            t = at.get((order, fmt, n, s))
            if t is None:
                cells += ["-"] * 4
                continue
            cells += [f"{t['wall_seconds']:.1f} s" if t["written"] else "not written",
                      f"{t['prompt_tokens']:,} / {t['cached_tokens']:,}", f"{t['completion_tokens']:,}",
                      "yes" if t["done"] else "no"]
        lines.append(_row(cells))
    what = (f"{session_what(data, listed=False)}; per turn and server the wait from the command to the "
            "turn's files written, the prompt tokens the server read and those it found in its caches, "
            "the tokens it wrote (summaries and commit messages too) and whether the edit was done")
    return what, lines


def render_network(table: Network, where: dict[str, tuple[str, str, str]]) -> str:
    data = load(table.file)
    rows = {(r["delay_ms"], r["method"]): r for r in data["rows"]}
    delays, far = data["delays_ms"], data["delays_ms"][-1]
    edits = any(r.get("file_edit_pass") is not None for r in data["rows"])
    passes = any(r.get("pass_at_1") is not None for r in data["rows"])
    heads = (["row"] + [f"decode at {d:g} ms: tok/s (x ar)" for d in delays]
             + [f"target calls/token at {far:g} ms", f"end to end at {far:g} ms: s (x ar)",
                "identical to ar"] + (["HumanEval passed"] if passes else [])
             + (["edit done"] if edits else []))
    lines = [_row(heads), "|---" * len(heads) + "|"]
    ar_e2e = (rows.get((far, "ar")) or {}).get("e2e_seconds")
    for method in table.methods:
        cells = [NETWORK_NAMES.get(method, method)]
        for d in delays:
            r = rows.get((d, method))
            speed = None if r is None else f"{r['tokens_per_second']:.1f} ({_ratio(r['ratio_vs_ar'])})"
            cells.append(speed or "-")
        r = rows.get((far, method)) or {}
        calls = r.get("target_calls_per_token")
        cells.append(f"{calls:.2f}" if calls is not None else "-")
        e2e = r.get("e2e_seconds")
        cells.append(f"{e2e:.1f} ({_ratio(ar_e2e / e2e)})" if e2e and ar_e2e else "-")
        # quality at every delay, where it differs (greedy: it should not, but for near-ties)
        for key, shown in (("exact_match", True), ("pass_at_1", passes), ("file_edit_pass", edits)):
            if shown:
                vals = [rows[(d, method)].get(key) for d in delays if (d, method) in rows]
                cells.append(", ".join(dict.fromkeys(f"{x:.0%}" for x in vals if x is not None)) or "-")
        lines.append(_row(cells))
    what = (f"the target on a ggml-rpc-server behind a proxy that holds each packet "
            f"{', '.join(f'{d:g}' for d in delays)} ms each way (a round trip twice that), "
            f"{table.workload}; ratios against `ar` at the same delay")
    return caption(table.file, what, where, data) + "\n\n" + "\n".join(lines) + "\n"


NETWORK_NAMES = {"sprinter:balanced": "`sprinter` (balanced, approximate)", "auto": "`auto`", "ar": "`ar`",
                 "sd": "`sd`", "lookup": "`lookup`", "llama-server": "llama.cpp's server, plain",
                 "llama-server-ngram-mod": "llama.cpp's server, ngram-mod",
                 "llama-server-draft-tuned": "llama.cpp's server, `-md` tuned"}


def render(name: str, where: dict[str, tuple[str, str, str]]) -> str:
    table = TABLES[name]
    if isinstance(table, Network):
        return render_network(table, where)
    if isinstance(table, Agents):
        return render_agents(table, where)
    if isinstance(table, Session):
        return render_session(table, where)
    if isinstance(table, Bounds):
        return render_bounds(table, where)
    if isinstance(table, Curves):
        return render_curves(table, where)
    if isinstance(table, Depths):
        return render_depths(table, where)
    if isinstance(table, Trial):
        return render_trial(table, where)
    return render_table(table, where)


# ---------------------------------------------------------------------------------------------
# pages


def render_text(text: str, page: str, where: dict[str, tuple[str, str, str]]) -> str:
    """`text` (the page `page`, relative to the repository root) with every table rendered."""
    prefix = "../" * page.count("/")

    def block(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise SystemExit(f"{page}: no table named {name!r} in tools/render_tables.py")
        body = render(name, where).replace("](results/", f"]({prefix}results/")
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(block, text)


def blocks(text: str) -> dict[str, str]:
    """A page's rendered blocks: table name -> its text."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def cited_files(text: str) -> set[str]:
    """The raw files the rendered blocks of a page cite."""
    return {f for body in blocks(text).values() for f in CITED.findall(body)}


def stale(page: str, text: str, where: dict[str, tuple[str, str, str]]) -> str:
    """The difference between a page's text and its rendering ("" when none)."""
    new = render_text(text, page, where)
    return "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), page, page))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render the results tables of the docs from results/.")
    p.add_argument("--check", action="store_true", help="exit 1 when a page differs from what is rendered")
    args = p.parse_args(argv)
    where = index()
    out_of_date = 0
    for page in PAGES:
        path = ROOT / page
        old = path.read_text(encoding="utf-8")
        if args.check:
            diff = stale(page, old, where)
            if diff:
                out_of_date += 1
                sys.stdout.write(diff)
            continue
        new = render_text(old, page, where)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"rendered {page}")
    return 1 if out_of_date else 0


if __name__ == "__main__":
    sys.exit(main())
