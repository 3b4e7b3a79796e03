"""The documentation's links resolve, and the README keeps the two setup commands verbatim.

Checked in README.md, docs/*.md and results/README.md: every relative Markdown link or image
(`[text](path)`, `![alt](path#anchor)`) names an existing file or folder, relative to the page,
and an anchor into a Markdown page names one of its headings; every bare `docs/...` or
`results/...` path inside inline code (commands, file names) exists relative to the repository
root. Fenced code blocks are not read for links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the README's fresh-machine commands; CI (.ci/run) runs the second one as written
SETUP_COMMANDS = (
    'tools/setup.sh && .venv/bin/sprinter-edge generate "Write a Python function that checks '
    'whether a string is a palindrome." --stats',
    "tools/setup.sh --dev && .venv/bin/python -m pytest -q",
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
    assert count_links(ROOT / "docs" / "benchmarks.md") >= 20


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
    ci = ROOT / ".ci" / "run"
    if not ci.exists():
        pytest.skip("no .ci/run in this checkout")
    assert SETUP_COMMANDS[1] in ci.read_text(encoding="utf-8").splitlines()


def test_results_tables_are_rendered_from_the_raw_runs() -> None:
    """Every table between `<!-- table: NAME -->` markers is what tools/render_tables.py makes of
    the raw JSON in results/ (rerun it after a new run; a hand edit fails here)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "tools" / "render_tables.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
