#!/usr/bin/env python3
"""Render the results tables of README.md and docs/*.md from the raw runs in results/.

A table in a page is the text between `<!-- table: NAME -->` and `<!-- /table -->`; NAME is a
key of TABLES below, which says which raw file(s) and rows it shows. The caption (date,
machine, command) comes from the file's line in results/README.md (date, machine) and the
file's own `command`; every number from the file's summary rows. Nothing is typed by hand.

    python3 tools/render_tables.py          # rewrite the tables in place
    python3 tools/render_tables.py --check  # exit 1 and show the difference when a page is stale

Stdlib only. tests/test_docs.py runs --check.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
PAGES = ("README.md", "docs/benchmarks.md")
# inputs renamed since a run recorded its command: the caption names the file as it is now
RENAMED = {"results/prompts-fresh-session7.jsonl": "results/prompts-fresh.jsonl"}
# extraction fields every method copies from the pasted source (structured tasks): the second
# field-accuracy column leaves them out
COPIED_FIELDS = ("name", "parameter_names")
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


@dataclass(frozen=True)
class Table:
    file: str  # a bench.json in results/
    methods: tuple[str, ...] = ()  # rows to show, in order (default: every row)
    workload: str | None = None  # the file's rows of this workload (its "groups") instead of all
    names: tuple[tuple[str, str], ...] = ()  # method -> how the row is named


TABLES: dict[str, Table] = {
    "fresh-prompts": Table("bench-results-fresh-s7-long-calls.json"),
    "function-edits": Table("bench-results-edits-long-calls.json"),
    "file-edits": Table("bench-results-file-edits-long-calls.json",
                        names=(("llama-server-ngram-mod", "llama.cpp server, ngram-mod"),)),
    "structured": Table("bench-results-structured-30-clean.json",
                        names=(("llama-server", "llama.cpp server, json_schema"),)),
    "first-use-edits": Table("bench-results-first-use-edits.json", workload="edit"),
    "first-use-fresh": Table("bench-results-first-use-edits.json", workload="chat"),
    "first-use-before-edits": Table("bench-results-first-use-before.json", workload="edit"),
    "first-use-before-fresh": Table("bench-results-first-use-before.json", workload="chat"),
}


def index() -> dict[str, tuple[str, str]]:
    """results/README.md's lines: file -> (date, machine)."""
    out = {}
    for line in (RESULTS / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`bench-results-"):
            out[cells[0].strip("`")] = (cells[2], cells[3])
    return out


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _done(row: dict) -> tuple[str, str] | None:
    """The task-level column: (header, cell) for the workload the row ran."""
    for n_key, pass_key, header in (("file_edit_n", "file_edit_pass", "edits done"),
                                    ("edit_n", "edit_pass", "edits done"),
                                    ("structured_n", "structured_valid", "valid replies"),
                                    ("humaneval_n", "pass_at_1", "pass@1")):
        n = row.get(n_key) or 0
        if n:
            return header, f"{round((row.get(pass_key) or 0) * n)}/{n}"
    return None


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
            fields = dict.fromkeys(("name", "parameter_names", "defaults", "returns_value", "raises"), False)
        for name, ok in fields.items():
            right_all += bool(ok)
            n_all += 1
            if name not in COPIED_FIELDS:
                right_rest += bool(ok)
                n_rest += 1
    return (right_all / n_all, right_rest / n_rest) if n_all and n_rest else None


def rows_of(data: dict, table: Table) -> list[dict]:
    rows = data["rows"] if table.workload is None else data["groups"][table.workload]
    if table.methods:
        by = {r["method"]: r for r in rows}
        rows = [by[m] for m in table.methods]
    return rows


def render(name: str, table: Table, where: dict[str, tuple[str, str]]) -> str:
    data = json.loads((RESULTS / table.file).read_text(encoding="utf-8"))
    rows = rows_of(data, table)
    ar = next((r for r in rows if r["method"] == "ar"), None)
    names = dict(table.names)
    done = [_done(r) for r in rows]
    header = ["method", "decode", "vs `ar`", "time to first token", "end to end, per prompt", "e2e vs `ar`"]
    if any(done):
        header.append(next(d for d in done if d)[0])
    accuracy = [field_accuracy(data, r["method"]) if r.get("structured_truth_n") else None for r in rows]
    if any(accuracy):
        without = " and ".join(f"`{f}`" for f in COPIED_FIELDS)
        header += ["field accuracy", f"field accuracy without {without}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, d, acc in zip(rows, done, accuracy, strict=True):
        e2e = row.get("e2e_seconds")
        e2e_ratio = ar["e2e_seconds"] / e2e if ar and e2e and ar.get("e2e_seconds") else None
        ttft = row.get("ttft_seconds")
        cells = [names.get(row["method"], f"`{row['method']}`"), f"{row['tokens_per_second']:.1f} tok/s",
                 _ratio(row.get("ratio_vs_ar")), f"{ttft:.1f} s" if ttft else "-",
                 f"{e2e:.1f} s" if e2e else "-", _ratio(e2e_ratio)]
        if any(done):
            cells.append(d[1] if d else "-")
        if any(accuracy):
            cells += [f"{x:.2f}" for x in acc] if acc else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    date, machine = where.get(table.file, ("(not in results/README.md)", "?"))
    command = data.get("command", "").split(" --out ")[0].replace(" --no-progress", "")
    command = re.sub(r"\S*/(results/[\w.-]+)", r"\1", command)  # a path inside the checkout
    for old, new in RENAMED.items():
        command = command.replace(old, new)
    group = f" of the `{table.workload}` group" if table.workload else ""
    prompts = f"{rows[0]['prompts']} prompts{group}"
    caption = (f"{date}, {machine}, {prompts}, from [results/{table.file}](results/{table.file}): "
               f"`{command}`")
    return caption + "\n\n" + "\n".join(lines) + "\n"


def rendered_page(path: Path, where: dict[str, tuple[str, str]]) -> str:
    text = path.read_text(encoding="utf-8")
    prefix = "../" if path.parent != ROOT else ""

    def block(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise SystemExit(f"{path.relative_to(ROOT)}: no table named {name!r} in tools/render_tables.py")
        body = render(name, TABLES[name], where).replace("](results/", f"]({prefix}results/")
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render the results tables of the docs from results/.")
    p.add_argument("--check", action="store_true", help="exit 1 when a page differs from what is rendered")
    args = p.parse_args(argv)
    where = index()
    stale = 0
    for page in PAGES:
        path = ROOT / page
        old = path.read_text(encoding="utf-8")
        new = rendered_page(path, where)
        if new == old:
            continue
        if args.check:
            stale += 1
            diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), page, page)
            sys.stdout.writelines(diff)
        else:
            path.write_text(new, encoding="utf-8")
            print(f"rendered {page}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
