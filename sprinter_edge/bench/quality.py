"""Quality measures: HumanEval pass@1, agreement with the target's greedy output, the
target's log-probability of what was generated, and SPRINTER's measured false-pass rate.

Nothing here runs inside a timed decode loop, and no numpy call here goes through BLAS
(no dot/matmul): a BLAS call wakes OpenBLAS threads that spin and steal llama.cpp's cores.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend.llama import common_prefix
from ..decoding.base import Origin

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- text overlap


def lcs_length(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the longest common subsequence (O(len(a) * len(b)) time, O(len(b)) memory)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over whitespace tokens (1.0 for two empty strings)."""
    c, r = candidate.split(), reference.split()
    if not c and not r:
        return 1.0
    lcs = lcs_length(c, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(c), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def token_agreement(tokens: Sequence[int], reference: Sequence[int]) -> tuple[bool, float]:
    """(identical, common-prefix length / reference length)."""
    i = common_prefix(list(tokens), list(reference))
    return list(tokens) == list(reference), i / max(1, len(reference))


# ---------------------------------------------------------------------------- HumanEval

_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str, problem: dict) -> str:
    """The program to test: the first fenced block (or the raw text), with the problem's
    imports, and the problem's own prompt in front when the function is not defined."""
    m = _FENCE.search(completion)
    code = m.group(1) if m else completion
    entry = problem.get("entry_point", "")
    prompt = problem.get("prompt", "")
    if entry and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return prompt + code
    imports = [ln for ln in prompt.splitlines() if re.match(r"^(from\s+\S+\s+)?import\s", ln)]
    return "\n".join(imports) + "\n" + code if imports else code


@functools.lru_cache(maxsize=1)
def network_isolation() -> tuple[str, ...]:
    """The command prefix that runs a child without network: `unshare -n` (root) or
    `unshare -rn` (user namespaces); empty when neither works here."""
    exe = shutil.which("unshare")
    if exe:
        for flags in (("-n",), ("-r", "-n")):
            try:
                ok = subprocess.run([exe, *flags, "true"], capture_output=True, timeout=10).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                return (exe, *flags)
    log.warning("cannot isolate HumanEval code from the network (no working `unshare -n`): "
                "it runs with a clean environment, resource limits and a time limit only")
    return ()


@dataclass
class ExecResult:
    passed: bool
    status: str  # "passed", "failed", "timeout"
    seconds: float
    detail: str = ""


def _limits(timeout: float) -> None:  # pragma: no cover - runs in the child
    gib = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (4 * gib, 4 * gib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    cpu = int(timeout) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


def run_program(source: str, timeout: float = 10.0) -> ExecResult:
    """Run Python source in a subprocess: temporary directory, empty environment, isolated
    interpreter (-I), no network when `unshare` allows it, memory/file/CPU limits, and a
    wall-clock limit that kills the whole process group."""
    with tempfile.TemporaryDirectory(prefix="sprinter-he-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(source, encoding="utf-8")
        cmd = [*network_isolation(), sys.executable, "-I", "-B", str(path)]
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True,
                                preexec_fn=functools.partial(_limits, timeout))
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return ExecResult(False, "timeout", time.perf_counter() - t0, f"over {timeout:g} s")
        seconds = time.perf_counter() - t0
        if proc.returncode == 0:
            return ExecResult(True, "passed", seconds)
        tail = err.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        return ExecResult(False, "failed", seconds, tail[0][:200])


def check_humaneval(problem: dict, completion: str, timeout: float = 10.0) -> ExecResult:
    """pass@1 of one greedy completion: the extracted code plus the problem's tests."""
    program = (extract_code(completion, problem) + "\n\n" + problem["test"] + "\n\n"
               + f"check({problem['entry_point']})\n")
    return run_program(program, timeout)


# ---------------------------------------------------------------------------- model scores


@dataclass
class TokenScores:
    """Per generated token: the target's log-prob, whether it is the target's greedy
    choice (the label), and TV(p, q) of the two models' distributions (temperature 1)."""

    logprob: np.ndarray
    greedy: np.ndarray  # bool
    tv: np.ndarray | None = None


def _rows(model: object, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Logits of the positions that predict each of `tokens`, in one decode call."""
    context = list(prompt) + list(tokens)
    out = model.sync(context, n_logits=len(tokens) + 1)  # type: ignore[attr-defined]
    return out.logits[: len(tokens)]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def score_tokens(target: object, prompt: list[int], tokens: list[int],
                 draft: object | None = None) -> TokenScores | None:
    """Score generated tokens with the target (and the draft for TV) in one call each.

    The rows come from one batch, so llama.cpp's batch-dependent kernels can move a
    near-tie by a little against token-by-token decoding."""
    n_batch = min(getattr(target, "n_batch", 512), getattr(draft, "n_batch", 512) if draft else 512)
    if not tokens or len(tokens) + 1 > n_batch:
        return None
    lp = _log_softmax(_rows(target, prompt, tokens).astype(np.float64))
    idx = np.asarray(tokens)
    logprob = lp[np.arange(len(tokens)), idx]
    greedy = lp.argmax(axis=1) == idx
    tv = None
    if draft is not None:
        lq = _log_softmax(_rows(draft, prompt, tokens).astype(np.float64))
        tv = 0.5 * np.abs(np.exp(lp) - np.exp(lq)).sum(axis=1)
    return TokenScores(logprob, greedy, tv)


@dataclass
class FalsePass:
    """SPRINTER's verifier judged against the greedy label on the tokens it kept."""

    kept: int
    false_pass: int  # kept tokens that are not the target's greedy choice
    rejected: int  # draft tokens the target replaced in a catch-up
    eta_fp: float  # false passes / (false passes + rejections): P(pass | label 0)
    mean_tv: float  # mean TV(p, q) over the generated positions
    tv_bound: float  # eta_fp * mean_tv: the bound on TV(p, p_sprinter)


def false_pass(origins: Sequence[Origin], scores: TokenScores, rejected: int) -> FalsePass:
    kept_mask = np.array([o == Origin.KEPT for o in origins[: len(scores.greedy)]], dtype=bool)
    kept = int(kept_mask.sum())
    fp = int((kept_mask & ~scores.greedy).sum())
    eta = fp / (fp + rejected) if fp + rejected else 0.0
    mean_tv = float(scores.tv.mean()) if scores.tv is not None and len(scores.tv) else 0.0
    return FalsePass(kept, fp, rejected, eta, mean_tv, eta * mean_tv)
