"""The edit benchmarks: edit requests a user types, each checked automatically.

- `functions`: single-function edits of HumanEval's canonical solutions (`FUNCTIONS`)
- `files`: whole-module edits of standard-library files (`FILES`), their files in
  `file_sources`, their behaviour check in `sandbox`
- `tasks`: the task-set type both use (`TaskSet`: order, selection, split, prompts) and the
  check result (`EditCheck`)
- `transforms`, `ast_tools`: how the tasks are made

`check_reply` picks the workload's check for a task (or its dict, as a prompt carries it).
"""

from __future__ import annotations

from . import files, functions
from .files import FILES, FileEditTask
from .functions import FUNCTIONS, EditTask
from .tasks import SPLITS, WORKLOADS, EditCheck, TaskSet, check_edit_name, parse_split, predicted_output

__all__ = ["FILES", "FUNCTIONS", "SPLITS", "WORKLOADS", "EditCheck", "EditTask", "FileEditTask", "TaskSet",
           "check_edit_name", "check_reply", "parse_split", "predicted_output"]


def check_reply(task: EditTask | FileEditTask | dict, reply: str, timeout: float = 10.0) -> EditCheck:
    """Whether a reply does its task, by the task's workload's check."""
    if files.is_file_task(task):
        return files.check_reply(task, reply, timeout)  # type: ignore[arg-type]
    return functions.check_reply(task, reply, timeout)  # type: ignore[arg-type]
