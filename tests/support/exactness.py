"""Exact distributions of the fixture models and the statistics that test a sampler against
them (tests/test_exactness.py, test_lookup.py, test_constrained.py, test_sampling.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np
from scipy import stats

from sprinter_edge import Engine, SamplingParams
from sprinter_edge.backend.llama import LlamaModel
from sprinter_edge.decoding import Origin
from sprinter_edge.decoding.sampling import distribution

ALPHA = 1e-3  # the significance level of every statistical test that uses these helpers
PROMPTS = (Path(__file__).parent.parent / "data" / "prompts_equivalence.txt").read_text().splitlines()
EOG = "<end>"  # the end-of-generation cell of a joint distribution


def next_dist(model: LlamaModel, context: list[int], params: SamplingParams) -> np.ndarray:
    """The model's next-token distribution after `context`, under `params`."""
    return distribution(model.sync(context, n_logits=1).logits[0], params)


def exact_joint(model: LlamaModel, prompt: list[int], params: SamplingParams, depth: int,
                dist: Callable[[list[int]], np.ndarray] | None = None) -> dict[tuple[Hashable, ...], float]:
    """The exact distribution of the first `depth` tokens `ar` samples from `model`: the
    probability tree expanded over the support (small under top-k). A path that reaches an
    end token stops there and ends with EOG. `dist(path)`: the next-token distribution after
    the prompt and `path` (default: the model's under `params`)."""
    if dist is None:
        def dist(path: list[int]) -> np.ndarray:
            return next_dist(model, prompt + path, params)
    joint: dict[tuple[Hashable, ...], float] = {(): 1.0}
    for _ in range(depth):
        grown: dict[tuple[Hashable, ...], float] = {}
        for path, weight in joint.items():
            if path and path[-1] == EOG:
                grown[path] = weight
                continue
            p = dist(list(path))  # type: ignore[arg-type]
            for x in np.flatnonzero(p):
                cell = path + ((EOG,) if model.is_eog(int(x)) else (int(x),))
                grown[cell] = grown.get(cell, 0.0) + weight * p[x]
        joint = grown
    return joint


def reply_cell(result) -> tuple[Hashable, ...]:  # noqa: ANN001
    """A reply's cell of a joint distribution: its tokens, then EOG if it stopped."""
    tail = (EOG,) if result.finish_reason == "stop" else ()
    return tuple(result.token_ids) + tail


def chisquare_pvalue(counts: Counter, expected: dict[Hashable, float], n: int) -> float:
    """Chi-square of observed counts against exact cell probabilities; cells expected fewer
    than 5 times are merged into one. An observation outside the support fails outright."""
    outside = {c: k for c, k in counts.items() if c not in expected}
    assert not outside, f"outcomes the exact distribution gives probability 0: {outside}"
    cells = sorted(expected, key=lambda c: -expected[c])
    exp = np.array([float(expected[c]) * n for c in cells], np.float64)  # cells may be float32
    obs = np.array([counts.get(c, 0) for c in cells], float)
    big = exp >= 5
    assert big.sum() >= 3, "too few well-filled cells for a meaningful test"
    if (~big).any():
        exp = np.append(exp[big], exp[~big].sum())
        obs = np.append(obs[big], obs[~big].sum())
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def sample_sd(engine: Engine, prompt: list[int], params: SamplingParams, n: int) -> tuple[Counter, Counter]:
    """`sd` with k = 2 on seeds 0..n-1: counts of each reply's cell and of every origin. A
    third token after two accepted drafts is always the bonus row's."""
    counts: Counter = Counter()
    seen: Counter = Counter()
    for seed in range(n):
        gen = engine.stream(prompt, params.replace(seed=seed), method="sd")
        gen.ctx.settings["draft_len"] = 2
        result = gen.consume()
        counts[reply_cell(result)] += 1
        seen.update(result.origins)
        if result.origins[:2] == [Origin.ACCEPTED, Origin.ACCEPTED] and len(result.origins) == 3:
            assert result.origins[2] is Origin.BONUS
    return counts, seen


def penalised_reference(logits: np.ndarray, context: list[int], prompt_len: int,
                        p: SamplingParams) -> np.ndarray:
    """The penalties spelled out: llama.cpp's repeat penalty on the distinct tokens of the
    last repeat_last_n context tokens (prompt included), then OpenAI's presence and frequency
    penalties on the tokens generated so far."""
    z = logits.astype(np.float64).copy()
    if p.repeat_penalty != 1 and p.repeat_last_n != 0:
        window = context if p.repeat_last_n < 0 else context[-p.repeat_last_n:]
        for t in set(window):
            z[t] = z[t] / p.repeat_penalty if z[t] > 0 else z[t] * p.repeat_penalty
    reply = context[prompt_len:]
    for t in set(reply):
        z[t] -= p.frequency_penalty * reply.count(t) + p.presence_penalty
    return z
