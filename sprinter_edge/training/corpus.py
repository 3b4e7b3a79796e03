"""The prompt corpus verifier data is collected on.

The default corpus (`prompts.jsonl`, shipped as package data) was written for this project
and is redistributable with it: code tasks in several languages, code explanation, fixes and
reviews, computer-science questions and general chat. It holds no benchmark problems
(no HumanEval), so the quality benchmarks stay unseen.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import SprinterError

DEFAULT_CORPUS = "sprinter-edge-prompts-v1"


@dataclass(frozen=True)
class CorpusPrompt:
    id: str
    category: str
    language: str
    prompt: str


@dataclass(frozen=True)
class Corpus:
    name: str
    prompts: tuple[CorpusPrompt, ...]

    def digest(self) -> str:
        h = hashlib.sha256()
        for p in self.prompts:
            h.update(f"{p.id}\0{p.prompt}\0".encode())
        return h.hexdigest()[:16]

    def shuffled(self, seed: int) -> list[CorpusPrompt]:
        """A fixed order that mixes categories, so a time-limited run still covers all."""
        order = list(self.prompts)
        random.Random(seed).shuffle(order)
        return order


def _parse(lines: list[str], source: str) -> list[CorpusPrompt]:
    out: list[CorpusPrompt] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
            item = CorpusPrompt(str(row.get("id", f"line{n}")), str(row.get("category", "")),
                                str(row.get("language", "")), str(row["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise SprinterError(f"{source}:{n}: not a prompt row ({exc})") from exc
        if item.id in seen:
            raise SprinterError(f"{source}:{n}: duplicate prompt id {item.id!r}")
        seen.add(item.id)
        out.append(item)
    if not out:
        raise SprinterError(f"{source}: no prompts")
    return out


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The shipped corpus, or a JSONL file of {"id", "prompt", ["category", "language"]}."""
    if path is None:
        text = resources.files(__package__).joinpath("prompts.jsonl").read_text("utf-8")
        return Corpus(DEFAULT_CORPUS, tuple(_parse(text.splitlines(), "prompts.jsonl")))
    p = Path(path)
    if not p.exists():
        raise SprinterError(f"prompt file not found: {p}")
    return Corpus(p.stem, tuple(_parse(p.read_text("utf-8").splitlines(), str(p))))


# Categories by the sort of text a reply is: code (and text about code) or prose.
CODE_CATEGORIES = ("code_write", "code_fix", "code_explain")
_LANGUAGE_WORDS = frozenset((
    "python", "go", "golang", "rust", "javascript", "js", "typescript", "ts", "java", "kotlin", "c",
    "cpp", "c++", "c#", "csharp", "ruby", "haskell", "swift", "php", "sql", "bash", "shell", "html",
    "css"))
_WORD = re.compile(r"[a-z0-9_+#]+")
NEAR_DUPLICATE = 0.6  # word-set Jaccard similarity, language names left out


def domain_of(item: CorpusPrompt) -> str:
    """'code' for the code categories, 'chat' for the rest (general chat, CS concepts)."""
    return "code" if item.category in CODE_CATEGORIES else "chat"


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _LANGUAGE_WORDS)


def prompt_groups(prompts: tuple[CorpusPrompt, ...] | list[CorpusPrompt]) -> list[int]:
    """A group id per prompt: near-duplicates (the same task asked in another language, or
    reworded) share one, so a train/test split by group never sees a task on both sides."""
    words = [_words(p.prompt) for p in prompts]
    parent = list(range(len(prompts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(words)):
        for j in range(i):
            union = len(words[i] | words[j])
            if union and len(words[i] & words[j]) / union >= NEAR_DUPLICATE:
                parent[root(i)] = root(j)
    roots: dict[int, int] = {}
    return [roots.setdefault(root(i), len(roots)) for i in range(len(prompts))]
