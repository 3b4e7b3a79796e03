"""The task-set type both edit workloads use, the check result they share, and the split.

A `TaskSet` is a workload's edits (names, in order), its sources (HumanEval problems or
standard-library modules) and a builder `build(edit, source) -> task | None`. It puts every
task in one fixed order (`order`: the edits take turns, each through the sources in a fixed
pseudo-random order of its own), selects from it, and makes the bench's prompts.

The split: every source is on one side, "tuning" or "report", by a fixed rule of its name
alone (`split_of`; never of outcomes), so every edit of one source is on the same side and no
source is seen on both. Speed tuning (thresholds, replays in tools/) uses the tuning side; the
docs report the other. `split=None` means both: the order of before there was a split, so
old commands and old results mean what they meant. The rule per workload is in its module
(`functions.split_of`, `files.split_of`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Generic, TypeVar

from ..prompts import CODE_BLOCK_END, BenchPrompt
from .ast_tools import digest

# tuning: traced, replayed, tuned on; report: looked at while developing (a development report);
# sealed: run only to report, on finished code (CONTRIBUTING's split rule), never unless named
SPLITS = ("tuning", "report", "sealed")
SEALED = "sealed"
# the bench's workloads (`BenchPrompt.workload`) whose replies an edit check reads
WORKLOADS = ("edit", "file_edit")

T = TypeVar("T")


def hash_split(source: str) -> str:
    """"tuning" when the SHA-256 of the source's name is even, else "report"."""
    return "tuning" if int(hashlib.sha256(source.encode()).hexdigest(), 16) % 2 == 0 else "report"


def parse_split(spec: str | None) -> str | None:
    """A split's name, or None (empty or None: both sides)."""
    if not spec:
        return None
    if spec not in SPLITS:
        raise ValueError(f"unknown split {spec}; choose from {', '.join(SPLITS)}")
    return spec


@dataclass
class EditCheck:
    """Whether a reply did its edit task. `edit` is the edit's name as the report shows it
    (a whole-file edit's with "file:" in front)."""

    passed: bool
    edit: str
    why: str = ""  # what failed first, "" when passed
    failure: str = ""  # "", "no-code", "parse", "change" or "tests"
    status: str = ""  # the sandbox's: passed, failed, timeout ("" when the tests did not run)
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> EditCheck:
        """From `asdict` (or its JSON); results from before the rename carry "kind" for `edit`."""
        return cls(**rename_old_keys(d, cls))


def rename_old_keys(d: dict, cls: type) -> dict:
    """`d`'s fields of dataclass `cls`, the old name "kind" read as "edit"."""
    names = {f.name for f in fields(cls)}
    d = {("edit" if k == "kind" and "edit" not in d else k): v for k, v in d.items()}
    return {k: v for k, v in d.items() if k in names}


def check_edit_name(check: dict) -> str:
    """The edit of a check as a results file stores it (`EditCheck` as a dict, old or new)."""
    return check["edit"] if "edit" in check else check["kind"]


def predicted_output(prompt: BenchPrompt) -> str | None:
    """What an editor sends as the Predicted Output of an edit: the code it asks to change."""
    return str(prompt.problem["code"]) if prompt.workload in WORKLOADS else None


def parse_names(spec: str | Sequence[str] | None, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """Comma-separated names out of `allowed` (empty or None: all of them), in `allowed`'s order."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec or ())
    items = [s for s in items if s]
    unknown = [s for s in items if s not in allowed]
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return tuple(k for k in allowed if k in items) if items else tuple(allowed)


def interleave(edits: Sequence[str], sources: Sequence[str],
               build: Callable[[str, str], T | None]) -> Iterator[T]:
    """Every task `build(edit, source)` makes, once, in one fixed order: the edits take turns,
    each going through the sources in a fixed pseudo-random order of its own and taking a
    source no earlier task used while there is one, so the first tasks are as independent as
    can be."""
    queues = {e: deque(sorted(sources, key=lambda s, e=e: digest(e, s))) for e in edits}
    skipped: dict[str, deque[str]] = {e: deque() for e in edits}
    used: set[str] = set()

    def take(edit: str) -> T | None:
        while queues[edit]:
            source = queues[edit].popleft()
            if source in used:
                skipped[edit].append(source)
            elif (task := build(edit, source)) is not None:
                used.add(source)
                return task
        while skipped[edit]:  # this edit has run out of fresh sources
            if (task := build(edit, skipped[edit].popleft())) is not None:
                return task
        return None

    while True:
        batch = [t for t in (take(e) for e in edits) if t is not None]
        if not batch:
            return
        yield from batch


@dataclass(frozen=True)
class TaskSet(Generic[T]):
    """One workload's tasks: `edits` (every edit's name, in order), `sources` (a callable
    giving the source names: read lazily, HumanEval's data is a package), `build(edit, source)`
    (the task, None where the edit does not apply) and `split_of(source)` (its side)."""

    workload: str  # the bench's workload of the prompts (`BenchPrompt.workload`)
    edits: tuple[str, ...]
    sources: Callable[[], Sequence[str]]
    build: Callable[[str, str], T | None]
    split_of: Callable[[str], str] = hash_split
    what: str = "edit"  # how an error message names an edit of this set

    def parse(self, spec: str | Sequence[str] | None) -> tuple[str, ...]:
        """Comma-separated edit names (empty or None: every edit), in `edits` order."""
        return parse_names(spec, self.edits, self.what)

    def source_names(self, split: str | None = None) -> list[str]:
        """The sources on one side (None: tuning and report: the sealed side only when named),
        in their own order."""
        split = parse_split(split)
        return [s for s in self.sources()
                if self.split_of(s) == split or split is None and self.split_of(s) != SEALED]

    def order(self, edits: Sequence[str] | None = None, split: str | None = None) -> Iterator[T]:
        """Every task of these edits on this side once, in one fixed order (`interleave`)."""
        return interleave(self.parse(edits), self.source_names(split), self.build)

    def select(self, n: int, edits: Sequence[str] | None = None, skip: int = 0,
               split: str | None = None) -> list[T]:
        """n tasks of `order(edits, split)` after the first `skip` (tasks held out from
        whatever was tuned on the first ones)."""
        return list(itertools.islice(self.order(edits, split), skip, skip + n))

    def all(self, edits: Sequence[str] | None = None, split: str | None = None) -> list[T]:
        """Every task that can be built, source by source."""
        chosen = self.parse(edits)
        return [t for s in self.source_names(split) for e in chosen if (t := self.build(e, s)) is not None]

    def prompts(self, n: int, edits: Sequence[str] | None = None, skip: int = 0,
                split: str | None = None) -> list[BenchPrompt]:
        """The bench's prompts of `select(n, edits, skip, split)`."""
        return [self.prompt(t) for t in self.select(n, edits, skip, split)]

    def prompt(self, task: Any) -> BenchPrompt:
        """The bench's prompt of a task: this workload, the task (as a dict) in `problem`;
        replies stop after their code block as HumanEval's do."""
        return BenchPrompt(task.id, task.prompt, self.workload, asdict(task), CODE_BLOCK_END)

    def find(self, task_id: str) -> T | None:
        """The task with this id (`workload/edit/source`, a problem by its number), rebuilt
        whatever order or selection it was run in; None when none is built under it."""
        workload, _, rest = task_id.partition("/")
        edit, _, name = rest.partition("/")
        if workload != self.workload or edit not in self.edits:
            return None
        source = next((s for s in self.sources() if name in (s, s.split("/")[-1])), None)
        return None if source is None else self.build(edit, source)
