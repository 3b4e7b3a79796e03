"""On-policy verifier data: tokens drafted along SPRINTER's own trajectories.

The draft-greedy collection (`collect.prompt_record`) labels what the draft would say on its
own; at run time a verifier sees something else: contexts where earlier flags put the
target's token into the text, run positions and catch-up outcomes produced by its own
decisions, and, when sampling, a token drawn at the user's temperature. Here each prompt is
decoded by SPRINTER's own proposer and acceptor (the speculative loop's) with a behaviour verifier (the pair's
shipped one at its balanced threshold), at each temperature asked for, and every drafted
token is kept with the features a verifier reads at that moment (`verifiers.base.
DraftFeatures`, the same code the decoder calls) and what the target says of it:

* `label_greedy`: the token is the target's argmax;
* `label_paper`: q(x) <= p(x) at the sampling temperature (temperature 1 under greedy);
* `accept_prob`: min(1, p(x) / q(x)) at the sampling settings -- the chance the SD test keeps
  the token, so 1 - accept_prob is the expected false pass of keeping it without the target
  (greedy: label_greedy);
* `tv`: TV(p, q) at the sampling settings (greedy: 1[argmax differs]).

Tokens the decoder sends to the target without asking the verifier (the run cap, the
end-of-generation check) are kept with `scored` = 0, so a simulation of another verifier
along the same trajectory prices them right.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import numpy as np

from ..backend.llama import LlamaModel
from ..decoding import DecodeContext, Stats
from ..decoding.acceptor import accept
from ..decoding.proposers.draft import DraftProposer, VerifierRun
from ..decoding.sampling import Sampler, SamplingParams, distribution
from ..numerics import softmax
from ..verifiers.base import DraftFeatures, Verifier

SCALARS = ("max_prob", "entropy", "margin", "logq_x", "q_ratio", "run_position", "since_flag",
           "last_accepted", "last_rejected", "output_position")
FIELDS = ("hidden", *SCALARS, "token", "target_token", "temperature", "accept_prob", "tv",
          "label_greedy", "label_paper", "scored", "passed", "prompt_index", "group", "domain")
DOMAIN_CODES = {"code": 0, "chat": 1}


@dataclass(frozen=True)
class Behaviour:
    """How the trajectories are decoded: the verifier, its threshold, the run cap."""

    verifier: Verifier
    threshold: float
    run_cap: int = 16

    def describe(self) -> dict[str, object]:
        """What identifies the behaviour in the data's metadata: a verifier file by its content,
        since a recalibrated file keeps its name but moves its thresholds."""
        path = getattr(self.verifier, "path", None)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path is not None else None
        return {"verifier": self.verifier.name, "digest": digest, "threshold": self.threshold,
                "run_cap": self.run_cap}


@dataclass
class _Drafted:
    features: DraftFeatures  # holds the draft's raw logits too
    scored: bool
    passed: bool = False


def _row(drafted: _Drafted, target_logits: np.ndarray, params: SamplingParams) -> dict[str, object]:
    """A drafted token's features (what the verifier read) and labels (what the target says)."""
    f = drafted.features
    row: dict[str, object] = {name: f.value(name) for name in SCALARS}
    row.update(hidden=f.hidden, token=f.token, temperature=f.temperature, scored=drafted.scored,
               passed=drafted.passed)
    row.update(_labels(drafted, target_logits, params))
    return row


def _labels(drafted: _Drafted, target_logits: np.ndarray, params: SamplingParams) -> dict[str, float]:
    x = drafted.features.token
    target_token = int(np.argmax(target_logits))
    greedy_ok = float(target_token == x)
    if params.greedy:
        p1, q1 = softmax(target_logits), softmax(drafted.features.logits)
        return {"target_token": target_token, "label_greedy": greedy_ok, "accept_prob": greedy_ok,
                "tv": 1.0 - greedy_ok, "label_paper": float(q1[x] <= p1[x])}
    p, q = distribution(target_logits, params), distribution(drafted.features.logits, params)
    return {"target_token": target_token, "label_greedy": greedy_ok,
            "accept_prob": float(min(1.0, p[x] / q[x])) if q[x] > 0 else 0.0,
            "tv": 0.5 * float(np.abs(p - q).sum()), "label_paper": float(q[x] <= p[x])}


def trajectory(draft: LlamaModel, target: LlamaModel, prompt: list[int], params: SamplingParams,
               behaviour: Behaviour, max_new: int) -> list[dict[str, object]]:
    """Decode like SPRINTER for up to max_new tokens; every drafted token with its labels.

    It runs the decoder's own proposer and acceptor (decoding/proposers/draft.py VerifierRun,
    decoding/acceptor.py); the only differences are that the target scores every row of each
    catch-up (the labels) and the drafted tokens are recorded with what the verifier read."""
    drafted: list[_Drafted] = []
    rule = VerifierRun(behaviour.verifier, behaviour.threshold, behaviour.run_cap,
                       on_drafted=lambda f, scored, passed: drafted.append(_Drafted(f, scored, passed)))
    proposer = DraftProposer(rule)
    ctx = DecodeContext(target=target, draft=draft, sampler=Sampler(params), stats=Stats(),
                        max_new_tokens=max_new)
    seq = list(prompt)
    out_rows: list[dict[str, object]] = []
    proposer.begin(ctx, seq)
    while ctx.produced < max_new:
        drafted.clear()
        proposal = proposer.propose(ctx, seq)
        done = accept(ctx, seq, proposal, all_rows=True)
        rows = done.rows  # rows[i] predicts proposal.tokens[i]
        if rows is None:  # budget reached inside a run: label the kept tokens, no test
            rows = target.sync(seq + proposal.tokens, n_logits=len(proposal)).logits
        out_rows += [_row(d, rows[i], params) for i, d in enumerate(drafted)]
        proposer.feedback(ctx, proposal, done.accepted)
        seq.extend(t for t, _ in done.step)
        ctx.produced += len(done.step)
        if any(target.is_eog(t) for t, _ in done.step):
            break
    return out_rows


def prompt_seed(prompt_id: str, temperature: float) -> int:
    """A fixed sampling seed per (prompt, temperature): reruns draw the same trajectories."""
    return zlib.crc32(f"{prompt_id}@{temperature:g}".encode())


_DTYPES = {"token": np.int32, "target_token": np.int32, "label_greedy": np.uint8,
           "label_paper": np.uint8, "scored": np.uint8, "passed": np.uint8}


def records(rows: list[dict[str, object]], *, prompt_index: int, group: int,
            domain: str) -> dict[str, np.ndarray]:
    """One trajectory's rows as the arrays of `FIELDS`."""
    n = len(rows)
    arrays: dict[str, np.ndarray] = {
        "hidden": np.array([r["hidden"] for r in rows], np.float16).reshape(n, -1)}
    for name in (*SCALARS, "token", "temperature", "target_token", "accept_prob", "tv",
                 "label_greedy", "label_paper", "scored", "passed"):
        arrays[name] = np.array([r[name] for r in rows], _DTYPES.get(name, np.float32))
    arrays["prompt_index"] = np.full(n, prompt_index, np.int32)
    arrays["group"] = np.full(n, group, np.int32)
    arrays["domain"] = np.full(n, DOMAIN_CODES[domain], np.uint8)
    return arrays
