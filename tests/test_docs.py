"""The documentation's links resolve, the README keeps the two setup commands verbatim, and the
results tables are what tools/render_tables.py renders from the raw files in results/.

Checked in README.md, docs/*.md and results/README.md: every relative Markdown link or image
(`[text](path)`, `![alt](path#anchor)`) names an existing file or folder, relative to the page,
and an anchor into a Markdown page names one of its headings; every bare `docs/...` or
`results/...` path inside inline code (commands, file names) exists relative to the repository
root. Fenced code blocks are not read for links.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the README's fresh-machine commands; CI (.ci/run) runs the second one as written
SETUP_COMMANDS = (
    'tools/setup.sh && .venv/bin/sprinter-edge generate "Write a Python function that checks '
    'whether a string is a palindrome." --stats',
    "tools/setup.sh --dev && .venv/bin/ruff check . && .venv/bin/python -m pytest -q",
)

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
BARE_PATH = re.compile(r"(?<![\w./~-])((?:docs|results)/[\w./-]*)")
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_files(root: Path = ROOT) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    if (root / "results" / "README.md").exists():
        files.append(root / "results" / "README.md")
    return files


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """What in `page` does not resolve, one 'page:line: target (why)' each."""
    problems = []
    name = page.relative_to(root)
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        without_code = CODE_SPAN.sub("", line)
        for target in LINK.findall(without_code):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{name}:{number}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{name}:{number}: {target} (no heading '{anchor}' in {dest.name})")
        for _, span in CODE_SPAN.findall(line):
            for path in BARE_PATH.findall(span):
                path = path.rstrip(".,:;")
                if not (root / path).exists():
                    problems.append(f"{name}:{number}: `{path}` (no such file)")
    return problems


def count_links(page: Path) -> int:
    n = 0
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        n += len(LINK.findall(CODE_SPAN.sub("", line)))
        n += sum(len(BARE_PATH.findall(span)) for _, span in CODE_SPAN.findall(line))
    return n


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_docs_have_links_to_check() -> None:
    # a parser that found nothing would pass every page
    assert count_links(ROOT / "README.md") >= 10
    assert count_links(ROOT / "docs" / "journal.md") >= 20


def test_the_checker_catches_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "there.json").write_text("{}")
    (tmp_path / "docs" / "other.md").write_text("# Some heading\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n"
        "[ok](results/there.json), [ok too](docs/other.md#some-heading), [web](https://x.org)\n"
        "[gone](results/missing.json) and ![img](docs/img/none.png)\n"
        "[bad anchor](docs/other.md#no-such-heading), [here](#title), [nowhere](#nowhere)\n"
        "run `tool --in results/there.json` then `cat docs/absent.md`.\n"
        "```\n[in a fence](not/checked.md) `docs/not-checked.md`\n```\n")
    problems = broken_links(page, root=tmp_path)
    assert problems == [
        "README.md:3: results/missing.json (no such file)",
        "README.md:3: docs/img/none.png (no such file)",
        "README.md:4: docs/other.md#no-such-heading (no heading 'no-such-heading' in other.md)",
        "README.md:4: #nowhere (no heading 'nowhere' in README.md)",
        "README.md:5: `docs/absent.md` (no such file)",
    ]


def test_slug_matches_github() -> None:
    assert slug("Held-out tasks 40-49, 2026-12-01, Xeon Ice Lake: `auto` stuck on `sd`, and the fix") == \
        "held-out-tasks-40-49-2026-12-01-xeon-ice-lake-auto-stuck-on-sd-and-the-fix"
    assert slug("The anchors: llama.cpp's own server") == "the-anchors-llamacpps-own-server"


def test_readme_keeps_the_setup_commands_verbatim_at_the_top() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    top = readme.split("\n## ", 1)[0]
    for command in SETUP_COMMANDS:
        assert command in top.splitlines(), f"README.md lost, above its first section: {command}"


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert SETUP_COMMANDS[1] in ci, "CI no longer runs the README's test command"


def test_results_tables_are_rendered_from_the_raw_runs() -> None:
    """Every table between `<!-- table: NAME -->` markers is what tools/render_tables.py makes of
    the raw JSON in results/ (rerun it after a new run; a hand edit fails here)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "tools" / "render_tables.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def render_tables() -> ModuleType:
    """tools/render_tables.py as a module (tools/ is not a package)."""
    name = "render_tables"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "render_tables.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


def _one_number_changed(body: str) -> tuple[str, str, str]:
    """`body` (a rendered block) with one number of its last table row changed (the last cell
    that holds one): (the new body, the row as rendered, the row as edited)."""
    row = [line for line in body.splitlines() if line.startswith("| ")][-1]
    cells = row.split(" | ")
    i = max(i for i, cell in enumerate(cells) if any(ch.isdigit() for ch in cell))
    at = next(j for j, ch in enumerate(cells[i]) if ch.isdigit())
    cells[i] = cells[i][:at] + ("1" if cells[i][at] != "1" else "2") + cells[i][at + 1:]
    edited = " | ".join(cells)
    return body.replace(row, edited), row, edited


@pytest.mark.parametrize("page", ["docs/results.md", "docs/journal.md"])
@pytest.mark.slow
def test_a_hand_edit_of_any_rendered_table_is_flagged(page: str) -> None:
    rt = render_tables()
    where = rt.index()
    text = (ROOT / page).read_text(encoding="utf-8")
    assert rt.stale(page, text, where) == ""
    found = list(rt.BLOCK.finditer(text))
    assert found, f"{page} has no rendered table"
    for m in found:
        body, row, edited = _one_number_changed(m.group(3))
        tampered = text[:m.start(3)] + body + text[m.end(3):]
        diff = rt.stale(page, tampered, where)
        assert f"-{edited}\n" in diff and f"+{row}\n" in diff, f"{m.group(2)}: a hand edit went unnoticed"
        assert rt.render_text(tampered, page, where) == text  # rendering puts the number back


def test_every_raw_file_a_table_cites_has_a_line_in_results_readme() -> None:
    rt = render_tables()
    listed = rt.index()
    cited = set().union(*(rt.cited_files((ROOT / page).read_text(encoding="utf-8")) for page in rt.PAGES))
    bench = {f for f in cited if f.startswith("bench-results-")}
    assert len(bench) >= 10, "the parser found too few cited runs"
    assert sorted(cited - set(listed)) == []
    assert all((ROOT / "results" / f).exists() for f in cited)


def test_a_raw_file_without_a_line_in_results_readme_is_refused() -> None:
    rt = render_tables()
    where = rt.index()
    where.pop("bench-results-edits.json")
    with pytest.raises(SystemExit, match="no line in results/README.md"):
        rt.render("edits-anchors", where)


def test_every_table_the_script_defines_is_on_a_page() -> None:
    rt = render_tables()
    shown = set().union(*(rt.blocks((ROOT / page).read_text(encoding="utf-8")) for page in rt.PAGES))
    assert sorted(set(rt.TABLES) - shown) == []



def session_outcome(baseline: str | None = None) -> dict:
    """A session.json as `bench --session --session-orders both` writes it (bench/session.py's
    own dataclasses and summary), with made-up numbers: the baseline wrote nothing in turn 3 of
    pass 1, `serve` nothing in turn 4 of pass 2; the plain server's turn 2 not done."""
    from sprinter_edge.bench import session

    plan = session.session_plan()
    config = session.SessionConfig(orders="both", baseline=baseline or session.BASELINE,
                                   command="sprinter-edge bench --session --session-orders both --threads 2 "
                                           "--offline --out /tmp/x/bench-out --no-progress")
    waits = {"serve:auto": (30.0, 40.0, 50.0, 20.0), session.BASELINE: (60.0, 70.0, 90.0, 40.0),
             "llama-server": (80.0, 100.0, 120.0, 50.0)}
    reads = {"serve:auto": 900, session.BASELINE: 1500, "llama-server": 4000}
    turns = []
    for order, rows in enumerate(session.passes(config), 1):
        for row in rows:
            for n, (step, wait) in enumerate(zip(plan.steps, waits[row], strict=True), 1):
                written = (row, n, order) not in {(session.BASELINE, 3, 1), ("serve:auto", 4, 2)}
                done = written and (row, n) != ("llama-server", 2)
                read = reads[row] * n
                turns.append(session.SessionTurn(
                    row, order, "whole", n, step.edit, list(step.files), wait + order, written,
                    wait + order + 10.0, done, "" if done else "change not made", commits=int(written),
                    requests=3, prompt_tokens=read, cached_tokens=5000 * n - read // 2,
                    completion_tokens=700 + 10 * n, prompt_seconds=read / 100, decode_seconds=20.0))
    outcome = session.SessionOutcome(config, [s.describe() for s in plan.steps], plan.split, turns,
                                     machine={"cpu": "AMD EPYC", "date": "2026-12-08",
                                              "aider": "aider 0.86.2"},
                                     notes=["llama-server-ngram-mod+reuse: a note"])
    return json.loads(json.dumps(outcome.to_dict()))


def rendered_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict) -> list[str]:
    """The `session` and `session-turns` blocks of a page rendered from `data` as a file of
    results/ (tables registered for the test only): each block's lines."""
    rt = render_tables()
    (tmp_path / "session-test.json").write_text(json.dumps(data))
    monkeypatch.setattr(rt, "RESULTS", tmp_path)
    monkeypatch.setitem(rt.TABLES, "session-test", rt.Session("session-test.json"))
    monkeypatch.setitem(rt.TABLES, "session-test-turns", rt.Session("session-test.json", turns=True))
    where = {"session-test.json": ("2026-12-08", "EPYC Zen 4", "`not this command`")}
    page = "".join(f"<!-- table: {name} -->\n<!-- /table -->\n"
                   for name in ("session-test", "session-test-turns"))
    rt.load.cache_clear()
    try:
        text = rt.render_text(page, "docs/results.md", where)
    finally:
        rt.load.cache_clear()
    return [body.splitlines() for body in rt.blocks(text).values()]


def test_a_session_renders_one_row_per_pass_and_server_and_one_per_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `Session` kind on a session.json: per pass and server the waits summed, the one to
    the files written over the turns both the row and the baseline wrote (pass 1: 1, 2 and 4;
    serve 31 + 41 + 21 s against 61 + 71 + 41 s), and per turn a group of columns per server."""
    rows, turns = rendered_session(tmp_path, monkeypatch, session_outcome())
    reuse = "llama.cpp's server, ngram-mod, with `--cache-reuse 256`"
    command = ("from [results/session-test.json](../results/session-test.json): "
               "`sprinter-edge bench --session --session-orders both --threads 2 --offline`")
    assert rows[0].startswith("2026-12-08, EPYC Zen 4, aider 0.86.2 (edit format `whole`) in a fresh git "
                              "repository of modules of the report split, 4 turns (rename function in "
                              "`fnmatch.py`, type hints in `unittest_util.py`, ")
    assert (f"one at a time: `sprinter-edge serve` (auto), then {reuse}, then llama.cpp's server, plain; "
            "pass 2 the same in reverse; note: llama-server-ngram-mod+reuse: a note; the waits from the "
            f"command, summed over the turns, ratios against {reuse} (the baseline) in the same pass, "
            f"{command}") in rows[0]
    assert rows[2:] == [
        "| pass | server | turns written | to files written, the turns both it and the baseline wrote | "
        "vs the baseline | to aider's exit, every turn | edits done | prompt tokens read (s) | reused | "
        "read vs the baseline | tokens written | requests |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        "| 1 | `sprinter-edge serve` (auto) | 4/4 | 93.0 s (3 turns) | 0.54x | 184.0 s | 4/4 | 9,000 (90 s) "
        "| 45,500 | 0.60x | 2,900 | 12 |",
        f"| 1 | {reuse} | 3/4 | 173.0 s (3 turns) | 1.00x | 304.0 s | 3/4 | 15,000 (150 s) | 42,500 | 1.00x "
        "| 2,900 | 12 |",
        "| 1 | llama.cpp's server, plain | 4/4 | 233.0 s (3 turns) | 1.35x | 394.0 s | 3/4 | 40,000 (400 s) "
        "| 30,000 | 2.67x | 2,900 | 12 |",
        "| 2 | llama.cpp's server, plain | 4/4 | 358.0 s (4 turns) | 1.34x | 398.0 s | 3/4 | 40,000 (400 s) "
        "| 30,000 | 2.67x | 2,900 | 12 |",
        f"| 2 | {reuse} | 4/4 | 268.0 s (4 turns) | 1.00x | 308.0 s | 4/4 | 15,000 (150 s) | 42,500 | 1.00x "
        "| 2,900 | 12 |",
        "| 2 | `sprinter-edge serve` (auto) | 3/4 | 126.0 s (3 turns) | 0.56x | 188.0 s | 3/4 | 9,000 (90 s) "
        "| 45,500 | 0.60x | 2,900 | 12 |",
    ]
    assert "4 turns, aider committing" in turns[0] and turns[0].endswith(command)  # the turns are the rows
    group = ["to files written", "prompt read / reused", "tokens written", "done"]
    heads = ["pass", "turn", "edit", "files", *(f"{name}: {h}" if h == group[0] else h
                                                   for name in ("`sprinter-edge serve` (auto)", reuse,
                                                                "llama.cpp's server, plain") for h in group)]
    assert turns[2:4] == ["| " + " | ".join(heads) + " |", "|---" * 16 + "|"]
    assert len(turns) == 4 + 8  # 2 passes of 4 turns
    assert turns[6] == ("| 1 | 3 | add docstrings | `genericpath.py` | 51.0 s | 2,700 / 13,650 | 730 | yes "
                        "| not written | 4,500 / 12,750 | 730 | no | 121.0 s | 12,000 / 9,000 | 730 | yes |")
    assert turns[-1] == ("| 2 | 4 | comment | `fnmatch.py` | not written | 3,600 / 18,200 | 740 | no "
                         "| 42.0 s | 6,000 / 17,000 | 740 | yes | 52.0 s | 16,000 / 12,000 | 740 | yes |")


def test_a_session_without_its_baseline_has_no_ratios(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rows, _ = rendered_session(tmp_path, monkeypatch, session_outcome(baseline="llama-server-draft-tuned"))
    assert "no ratios (the baseline, llama.cpp's server, `-md` tuned, did not run)" in rows[0]
    assert rows[4] == ("| 1 | `sprinter-edge serve` (auto) | 4/4 | - | - | 184.0 s | 4/4 | 9,000 (90 s) "
                       "| 45,500 | - | 2,900 | 12 |")


def test_session_rows_are_named_as_the_agents_tables_name_them() -> None:
    from sprinter_edge.bench import session

    rt = render_tables()
    reuse, options = rt.SESSION_REUSE
    assert (reuse, options.split()) == (session.REUSE, list(session.REUSE_OPTIONS))
    assert rt.session_server("serve:auto") == rt.AGENT_SERVERS["serve:auto"]
    assert rt.session_server("serve:lookup") == "`sprinter-edge serve` (lookup)"
    assert rt.session_server("llama-server") == "llama.cpp's server, plain"
    assert rt.session_server("llama-server-draft-tuned+reuse") == \
        "llama.cpp's server, `-md` tuned, with `--cache-reuse 256`"
    assert rt.session_server("llama-server-ngram-simple+reuse") == \
        "llama.cpp's server, ngram-simple, with `--cache-reuse 256`"
