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
