"""Quality measures: HumanEval pass@1, agreement with the target's greedy output, the
target's log-probability of what was generated, and SPRINTER's measured false-pass rate and
drift from the target.

SPRINTER's drift. The verifiers scored here (the confidence rule and the shipped ONNX
verifier) read the draft's logits or hidden state at the context, not the sampled token, so at
each context the verifier's decision `pass` is fixed before the token is drawn and SPRINTER's
next token is distributed as pass * q + (1 - pass) * p, with p and q the target's and the
draft's next-token distributions after the run's sampling transform (temperature, top-k,
top-p; greedy: the one-hot argmax). Its distance from the target's next-token distribution is
1[pass] * TV(p, q). The bench reports the mean of that over the generated tokens (`tv_drift`),
with TV(p, q) at the settings the run used (greedy: TV = 1[argmax_p != argmax_q]), and `pass`
observed as the token's origin being `kept`. Only under greedy decoding does this equal a
false-pass rate times something: there the mean of 1[pass] * 1[argmax differs] is
P(pass | argmax differs) * P(argmax differs), i.e. eta_FP * P(argmax differs) when eta_FP is
measured on the same positions. At temperature > 0 a verifier with eta_FP = 0 still drifts.

A verifier that reads the drawn token x (the hidden-state option reads log q(x); the oracle
compares x with ar's output) breaks the mixture above. For any verifier, couple SPRINTER with
standard SD on the same draw x and uniform u: the two outputs differ only where SPRINTER keeps
x and SD would reject it, so the distance from the target per token is at most the mean of
1[kept] * (1 - min(1, p(x)/q(x))) (`fp_mass`, "FP mass/tok"), with equality in expectation
when the decision does not depend on x. It is the figure to compare verifiers by at
temperature > 0, and what `verifier study` replays.

Nothing here runs inside a timed decode loop, and no numpy call here goes through BLAS
(no dot/matmul): a BLAS call wakes OpenBLAS threads that spin and steal llama.cpp's cores.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:
    import resource
except ImportError:  # Windows: the HumanEval sandbox runs without memory/file/CPU limits there
    resource = None  # type: ignore[assignment]

from ..backend.llama import common_prefix
from ..decoding import Origin
from ..decoding.sampling import SamplingParams, distribution

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


def code_block(completion: str) -> str | None:
    """The first fenced (```python, ``` or ```py) block of a reply, None when it has none;
    a block the reply leaves open (cut by a stop string or the token budget) runs to the end."""
    m = _FENCE.search(completion)
    return m.group(1) if m else None


def extract_code(completion: str, problem: dict) -> str:
    """The program to test: the first fenced block (or the raw text), with the problem's
    imports, and the problem's own prompt in front when the function is not defined."""
    block = code_block(completion)
    code = completion if block is None else block
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
                "it runs with a clean environment, %sa time limit only",
                "resource limits and " if resource is not None else "")
    return ()


@dataclass
class ExecResult:
    passed: bool
    status: str  # "passed", "failed", "timeout"
    seconds: float
    detail: str = ""


def _limits(timeout: float) -> None:  # pragma: no cover - runs in the child
    gib, cpu = 1 << 30, int(timeout) + 2
    for limit, value in ((resource.RLIMIT_AS, 4 * gib), (resource.RLIMIT_FSIZE, 16 << 20),
                         (resource.RLIMIT_CPU, cpu)):
        with contextlib.suppress(ValueError, OSError):  # one the system refuses (macOS: RLIMIT_AS)
            resource.setrlimit(limit, (value, value))


def sandbox_env(home: str) -> dict[str, str]:
    """The whole environment of a sandboxed child: `home` as its home, the system's binaries."""
    if sys.platform == "win32":  # Python cannot start on Windows without SYSTEMROOT
        root = os.environ.get("SYSTEMROOT", r"C:\Windows")
        return {"PATH": os.pathsep.join((os.path.join(root, "System32"), root)), "SYSTEMROOT": root,
                "USERPROFILE": home, "HOME": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    return {"PATH": os.pathsep.join(("/usr/bin", "/bin")), "HOME": home, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0"}


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """The child and its process group (POSIX); the child alone where there are no groups."""
    with contextlib.suppress(ProcessLookupError):
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # Windows: TerminateProcess, the child only
            proc.kill()


def run_program(source: str, timeout: float = 10.0) -> ExecResult:
    """Run Python source in a subprocess: temporary directory, empty environment, isolated
    interpreter (-I), no network when `unshare` allows it, memory/file/CPU limits (where the
    `resource` module is: not Windows), and a wall-clock limit that kills the whole process
    group (Windows: the child)."""
    with tempfile.TemporaryDirectory(prefix="sprinter-he-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(source, encoding="utf-8")
        cmd = [*network_isolation(), sys.executable, "-I", "-B", str(path)]
        env = sandbox_env(tmp)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True,
                                preexec_fn=functools.partial(_limits, timeout) if resource else None)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            proc.communicate()
            return ExecResult(False, "timeout", time.perf_counter() - t0, f"over {timeout:g} s")
        seconds = time.perf_counter() - t0
        if proc.returncode == 0:
            return ExecResult(True, "passed", seconds)
        tail = err.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        return ExecResult(False, "failed", seconds, tail[0][:200])


def check_humaneval(problem: dict, completion: str, timeout: float = 10.0) -> ExecResult:
    """pass@1 of one greedy completion: the extracted code plus the problem's tests."""
    return run_tests(extract_code(completion, problem), problem, timeout)


def run_tests(code: str, problem: dict, timeout: float = 10.0) -> ExecResult:
    """`code` followed by the problem's tests (`test`, then `check(entry_point)`), sandboxed."""
    program = code + "\n\n" + problem["test"] + "\n\n" + f"check({problem['entry_point']})\n"
    return run_program(program, timeout)


# ---------------------------------------------------------------------------- model scores


@dataclass
class TokenScores:
    """Per generated token: the target's log-prob (temperature 1), whether the token is the
    target's greedy choice (the greedy label), and, when the draft was scored too, TV(p, q)
    of the two models' next-token distributions at the sampling settings of the run (greedy:
    1[argmax differs]) and whether the two models' argmax differ."""

    logprob: np.ndarray
    greedy: np.ndarray  # bool
    tv: np.ndarray | None = None
    argmax_differs: np.ndarray | None = None  # bool
    sampling: SamplingParams | None = None  # the settings tv was computed at
    reject: np.ndarray | None = None  # the SD test's rejection probability of the token, at sampling


def _rows(model: object, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Logits of the positions that predict each of `tokens`, in one decode call."""
    context = list(prompt) + list(tokens)
    out = model.sync(context, n_logits=len(tokens) + 1)  # type: ignore[attr-defined]
    return out.logits[: len(tokens)]


def _token_logprob(logits: np.ndarray, tokens: np.ndarray, chunk: int = 32) -> np.ndarray:
    """log softmax(logits)[token] per row: float32 exponentials, float64 sums, a few rows at a
    time (the full float64 log-softmax of 300 x 152k logits took 2 s a run)."""
    out = np.empty(len(tokens))
    for s in range(0, len(tokens), chunk):
        x = logits[s : s + chunk]
        top = x.max(axis=1, keepdims=True)
        lse = np.log(np.exp(x - top).sum(axis=1, dtype=np.float64)) + top[:, 0]
        out[s : s + chunk] = x[np.arange(len(x)), tokens[s : s + chunk]] - lse
    return out


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _distribution_rows(p_logits: np.ndarray, q_logits: np.ndarray, sampling: SamplingParams,
                       chunk: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first row, p rows, q rows): the distributions the sampler draws from for these logits
    (`decoding.sampling.distribution`), plain temperature a few rows at a time to bound memory."""
    if sampling.top_k == 0 and sampling.top_p >= 1.0:
        for s in range(0, len(p_logits), chunk):
            yield (s, _softmax_rows(p_logits[s : s + chunk].astype(np.float64) / sampling.temperature),
                   _softmax_rows(q_logits[s : s + chunk].astype(np.float64) / sampling.temperature))
        return
    for s, (a, b) in enumerate(zip(p_logits, q_logits, strict=True)):
        yield s, distribution(a, sampling)[None], distribution(b, sampling)[None]


def sampled_divergence(p_logits: np.ndarray, q_logits: np.ndarray, tokens: np.ndarray,
                       sampling: SamplingParams, chunk: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per row: TV(p, q), and the SD test's rejection probability of the drawn token x,
    1 - min(1, p(x)/q(x)) (0 where q(x) = 0: the draft cannot have drawn x), p and q the
    distributions the sampler draws from for these logits. Greedy (temperature 0 or top-k 1):
    one-hot argmax, so TV = 1[argmax differs] and the rejection 1[x is the draft's argmax but
    not the target's]. Elementwise numpy only (no BLAS)."""
    p_logits = np.asarray(p_logits)
    q_logits = np.asarray(q_logits)
    tokens = np.asarray(tokens)
    if sampling.greedy:
        pa, qa = p_logits.argmax(axis=1), q_logits.argmax(axis=1)
        return (pa != qa).astype(np.float64), ((tokens == qa) & (tokens != pa)).astype(np.float64)
    tv = np.empty(len(p_logits))
    reject = np.empty(len(p_logits))
    for s, p, q in _distribution_rows(p_logits, q_logits, sampling, chunk):
        rows = np.arange(len(p))
        tv[s : s + len(p)] = 0.5 * np.abs(p - q).sum(axis=1)
        px, qx = p[rows, tokens[s : s + len(p)]], q[rows, tokens[s : s + len(p)]]
        ratio = np.divide(px, qx, out=np.ones_like(px), where=qx > 0)
        reject[s : s + len(p)] = 1.0 - np.minimum(1.0, ratio)
    return tv, reject


def score_tokens(target: object, prompt: list[int], tokens: list[int],
                 draft: object | None = None, sampling: SamplingParams | None = None) -> TokenScores | None:
    """Score generated tokens with the target (and the draft, for TV) in one call each.

    `sampling`: the settings the run was generated with (default: greedy); TV(p, q) is
    computed after that transform. The rows come from one batch, so llama.cpp's
    batch-dependent kernels can move a near-tie by a little against token-by-token decoding."""
    sampling = sampling if sampling is not None else SamplingParams()
    n_batch = min(getattr(target, "n_batch", 512), getattr(draft, "n_batch", 512) if draft else 512)
    if not tokens or len(tokens) + 1 > n_batch:
        return None
    t_logits = _rows(target, prompt, tokens)
    idx = np.asarray(tokens)
    logprob = _token_logprob(t_logits, idx)
    t_argmax = t_logits.argmax(axis=1)
    greedy = t_argmax == idx
    if draft is None:
        return TokenScores(logprob, greedy)
    d_logits = _rows(draft, prompt, tokens)
    differs = t_argmax != np.asarray(d_logits).argmax(axis=1)
    tv, reject = sampled_divergence(t_logits, d_logits, idx, sampling)
    return TokenScores(logprob, greedy, tv, differs, sampling, reject)


@dataclass
class FalsePass:
    """SPRINTER's verifier on one run: its false passes against the greedy label, and the
    run's drift from the target at the sampling settings used (see the module docstring).

    `per_token` holds the raw numbers every figure here is computed from, one entry per
    generated token: kept (1 = passed by the verifier), tv (TV(p, q) at `sampling`), reject
    (the SD test's rejection probability of the token at `sampling`), greedy (1 = the token is
    the target's argmax), argmax_differs (1 = the two models' argmax differ).
    tv_drift = mean(kept * tv); fp_mass = mean(kept * reject); eta_fp = sum(kept * (1 - greedy))
    / (that + rejected)."""

    kept: int
    false_pass: int  # kept tokens that are not the target's greedy choice
    rejected: int  # draft tokens the target replaced in a catch-up
    eta_fp: float  # false passes / (false passes + rejections): P(pass | label 0), greedy label
    tokens: int  # generated tokens scored
    tv_drift: float | None  # mean over tokens of 1[kept] * TV(p, q) at `sampling`
    fp_mass: float | None  # mean over tokens of 1[kept] * (1 - min(1, p(x)/q(x))) at `sampling`
    mean_tv: float | None  # mean TV(p, q) at `sampling` (the draft alone would drift this much)
    p_argmax_differs: float | None  # share of tokens whose target and draft argmax differ
    sampling: dict = field(default_factory=dict)  # temperature, top_k, top_p, greedy
    per_token: dict = field(default_factory=dict)


def false_pass(origins: Sequence[Origin], scores: TokenScores, rejected: int) -> FalsePass:
    n = len(scores.greedy)
    kept_mask = np.array([o == Origin.KEPT for o in origins[:n]], dtype=bool)
    if len(kept_mask) < n:  # cannot happen for an engine run; be safe
        kept_mask = np.concatenate([kept_mask, np.zeros(n - len(kept_mask), bool)])
    kept = int(kept_mask.sum())
    fp = int((kept_mask & ~scores.greedy).sum())
    eta = fp / (fp + rejected) if fp + rejected else 0.0
    per_token: dict[str, list] = {"kept": kept_mask.astype(int).tolist(),
                                  "greedy": scores.greedy.astype(int).tolist()}
    drift = mean_tv = p_diff = fp_mass = None
    sampling: dict = {}
    if scores.tv is not None and n:
        drift = float((kept_mask * scores.tv).mean())
        mean_tv = float(scores.tv.mean())
        per_token["tv"] = [round(float(v), 6) for v in scores.tv]
        if scores.reject is not None:
            fp_mass = float((kept_mask * scores.reject).mean())
            per_token["reject"] = [round(float(v), 6) for v in scores.reject]
        if scores.argmax_differs is not None:
            p_diff = float(scores.argmax_differs.mean())
            per_token["argmax_differs"] = scores.argmax_differs.astype(int).tolist()
    if scores.sampling is not None:
        sp = scores.sampling
        sampling = {"temperature": sp.temperature, "top_k": sp.top_k, "top_p": sp.top_p,
                    "greedy": sp.greedy}
    return FalsePass(kept, fp, rejected, eta, n, drift, fp_mass, mean_tv, p_diff, sampling, per_token)


def tv_totals(false_passes: Sequence[dict]) -> dict:
    """Token-weighted figures over several runs' `FalsePass` dicts (as stored in bench.json):
    tv_drift = sum(kept * tv) / tokens, fp_mass = sum(kept * reject) / tokens, mean_tv,
    p_argmax_differs, and whether every run was greedy. None where a run lacks the draft's
    scores."""
    n = sum(f["tokens"] for f in false_passes)
    have = all("tv" in f.get("per_token", {}) for f in false_passes) and n > 0
    out: dict = {"tokens": n, "greedy": all(f.get("sampling", {}).get("greedy", False)
                                            for f in false_passes),
                 "tv_drift": None, "fp_mass": None, "mean_tv": None, "p_argmax_differs": None}
    if have:
        pt = [f["per_token"] for f in false_passes]
        out["tv_drift"] = sum(k * t for d in pt for k, t in zip(d["kept"], d["tv"], strict=True)) / n
        if all("reject" in d for d in pt):
            out["fp_mass"] = sum(k * r for d in pt for k, r in zip(d["kept"], d["reject"], strict=True)) / n
        out["mean_tv"] = sum(sum(d["tv"]) for d in pt) / n
        if all("argmax_differs" in d for d in pt):
            out["p_argmax_differs"] = sum(sum(d["argmax_differs"]) for d in pt) / n
    return out
