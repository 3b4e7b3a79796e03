"""Turning logits into next-token choices, identically for draft and target.

`Sampler.prepare(logits, context)` maps a logits row to what the sampler needs: first the
repetition penalties (a logits transform that depends on the tokens before the row), then
the argmax under greedy decoding, otherwise the probability vector after temperature, top-k
and top-p. Both models' rows go through the same transform with the same context, so the
speculative test below is exact for the distribution the user asked for.

Penalties (`Penalties`), on the logits row z of the token after `context`:
- repeat penalty (llama.cpp's `repeat_penalty`, `repeat_last_n`): every distinct token among
  the last `repeat_last_n` tokens of the context, prompt included (-1: the whole context),
  gets z / r where z > 0 and z * r otherwise;
- presence and frequency penalties (OpenAI's semantics): every token generated so far (the
  context after the prompt, see `Sampler.start`) gets z - frequency * count - presence.
  llama.cpp's server counts these two over the same last-n window as the repeat penalty,
  prompt included; OpenAI and this package count the reply only.
- logit bias (OpenAI's `logit_bias`): a fixed amount added to given tokens' logits, after the
  penalties. Part of the target's distribution like them, so every method samples the biased
  distribution (greedy: the biased argmax) and stays exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SettingsError

if TYPE_CHECKING:
    from ..grammar.spec import Constraint

MAX_LOGPROBS = 20  # most alternatives per token (OpenAI's top_logprobs limit)

# Candidate pool for top-p: the nucleus is searched among the most likely tokens first and
# the full vocabulary is sorted only when those do not reach top_p.
_TOP_P_POOL = 1024


@dataclass(frozen=True)
class SamplingParams:
    """What one reply may look like: length, randomness, where it stops.

    The one place the generation defaults live; the CLI, the chat REPL, the server and the
    Python API all build one of these (`replace` derives a variant)."""

    max_tokens: int | None = 256  # None: the reply runs to its end, or the context's
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop before the first of these texts
    # log-probabilities of the committed tokens under the target (None: off; 0: the chosen
    # token's only; k: plus the k most likely tokens); see DecodeContext.record_target
    logprobs: int | None = None
    presence_penalty: float = 0.0  # OpenAI: minus this for every token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this times its count in the reply so far
    repeat_penalty: float = 1.0  # llama.cpp: 1.0 off; > 1 discourages recent tokens
    repeat_last_n: int = 64  # llama.cpp: the window of the repeat penalty; 0 off, -1 all
    # the reply must match this (JSON schema, regex, grammar): every method then samples from
    # the target's distribution masked to the allowed tokens and renormalised (None: free text)
    constraint: Constraint | None = None
    # OpenAI's Predicted Outputs: text the reply is expected to repeat (the file being edited);
    # the copy proposers align with it first. Changes no token of the output.
    prediction: str | None = None
    # OpenAI's logit_bias: (token id, amount in [-100, 100]) pairs added to the logits
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        for token, amount in self.logit_bias:
            if not isinstance(token, int) or token < 0:
                raise SettingsError(f"logit_bias: {token!r} is not a token id")
            if not -100 <= amount <= 100:
                raise SettingsError(f"logit_bias: the bias of token {token} must be between -100 and 100")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(s for s in self.stop if s))
        if self.max_tokens is not None and self.max_tokens < 0:
            raise SettingsError("max_tokens must be >= 0")
        if self.temperature < 0:
            raise SettingsError("temperature must be >= 0")
        if self.top_k < 0:
            raise SettingsError("top_k must be >= 0")
        if not 0 < self.top_p <= 1:
            raise SettingsError("top_p must be in (0, 1]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise SettingsError(f"logprobs must be between 0 and {MAX_LOGPROBS}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SettingsError(f"{name} must be between -2 and 2")
        if not 0 < self.repeat_penalty <= 10:
            raise SettingsError("repeat_penalty must be in (0, 10] (1.0: off)")
        if self.repeat_last_n < -1:
            raise SettingsError("repeat_last_n must be >= -1 (-1: the whole context, 0: off)")

    @property
    def penalised(self) -> bool:
        """Whether any repetition penalty changes the logits."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0 or bool(self.logit_bias)
                or (self.repeat_penalty != 1.0 and self.repeat_last_n != 0))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities after temperature, top-k and top-p (float32, zeros outside).

    One new float32 array worked in place (scale, shift, exp, normalise): at temperature > 0
    this runs for every row a speculative round tests, so each pass over the 152k-token
    vocabulary counts (float64 copies made it ~3x slower). numpy's pairwise sums keep the
    normalisation to ~1e-7; `Sampler.draw` accumulates the CDF in float64."""
    scaled = np.multiply(logits, np.float32(1.0 / params.temperature), dtype=np.float32)
    n = scaled.shape[0]
    keep: np.ndarray | None = None
    if 0 < params.top_k < n:
        keep = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    if params.top_p < 1.0:
        pool = keep if keep is not None else np.argpartition(-scaled, min(_TOP_P_POOL, n) - 1)[
            : min(_TOP_P_POOL, n)
        ]
        full = _softmax_(scaled.copy() if keep is None else _masked(scaled, keep))
        order = pool[np.argsort(-full[pool], kind="stable")]
        cum = np.cumsum(full[order], dtype=np.float64)
        if cum[-1] < params.top_p and keep is None:
            order = np.argsort(-full, kind="stable")
            cum = np.cumsum(full[order], dtype=np.float64)
        cut = int(np.searchsorted(cum, params.top_p)) + 1
        keep = order[:cut]
    if keep is not None:
        scaled = _masked(scaled, keep)
    return _softmax_(scaled)


def masked(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A copy of a logits row with the tokens `mask` disallows at -inf: a grammar's constraint,
    applied before `Sampler.prepare` so greedy picks and distributions stay inside it."""
    return np.where(mask, logits, np.float32(-np.inf)).astype(np.float32, copy=False)


def _softmax_(z: np.ndarray) -> np.ndarray:
    """softmax of float32 `z`, in place (-inf entries become 0)."""
    z -= z.max()
    np.exp(z, out=z)
    z /= z.sum()
    return z


def _masked(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    out = np.full_like(values, -np.inf)
    out[keep] = values[keep]
    return out


class _Counts:
    """How often each token occurs in context[offset:], kept up to date incrementally.

    The contexts a strategy passes grow by a few tokens between calls and shrink back after a
    rejection, so each call pops and pushes only the tokens that changed (plus one C-level
    comparison of the kept prefix; no Python loop over the context)."""

    def __init__(self, offset: int, n_vocab: int):
        self.offset = offset
        self.tokens: list[int] = []  # context[offset:] as of the last call
        self.counts = np.zeros(n_vocab, np.int32)
        # the distinct tokens in order of first occurrence: popping the last position of a
        # token's first occurrence always removes the newest entry, so this is a stack
        self.seen = np.empty(n_vocab, np.int64)
        self.n_seen = 0

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Count context[offset:]; return the distinct tokens in it (a view)."""
        tail_len = max(0, len(context) - self.offset)
        keep = min(len(self.tokens), tail_len)
        head = context[self.offset:self.offset + keep]
        if keep and (head if isinstance(head, list) else list(head)) != self.tokens[:keep]:
            a = np.asarray(self.tokens[:keep], np.int64)
            b = np.asarray(context[self.offset:self.offset + keep], np.int64)
            keep = int(np.flatnonzero(a != b)[0])
        counts, seen = self.counts, self.seen
        for t in reversed(self.tokens[keep:]):
            counts[t] -= 1
            if counts[t] == 0:
                self.n_seen -= 1
        del self.tokens[keep:]
        for t in context[self.offset + keep:]:
            t = int(t)
            if counts[t] == 0:
                seen[self.n_seen] = t
                self.n_seen += 1
            counts[t] += 1
            self.tokens.append(t)
        return seen[:self.n_seen]


class Penalties:
    """The repetition penalties of `params` as a logits transform (see the module docstring).

    Cost per row: a copy of the row, then work on the penalised tokens only (the distinct
    tokens of the repeat window and of the reply so far), never a pass over the context."""

    def __init__(self, params: SamplingParams, prompt_len: int):
        self.params = params
        self.prompt_len = prompt_len
        self._reply: _Counts | None = None  # presence / frequency: context[prompt_len:]
        self._all: _Counts | None = None  # repeat penalty with repeat_last_n = -1
        self._bias_ids = np.array([t for t, _ in params.logit_bias], np.int64)
        self._bias = np.array([b for _, b in params.logit_bias], np.float32)

    def apply(self, logits: np.ndarray, context: Sequence[int]) -> np.ndarray:
        p = self.params
        z = np.array(logits, dtype=np.float32)  # a copy: the raw row stays as decoded
        n_vocab = z.shape[0]
        if p.repeat_penalty != 1.0 and p.repeat_last_n != 0 and len(context):
            if p.repeat_last_n < 0:
                if self._all is None:
                    self._all = _Counts(0, n_vocab)
                ids = self._all.sync(context)
            else:
                ids = np.unique(np.asarray(context[-p.repeat_last_n:], np.int64))
            v = z[ids]
            z[ids] = np.where(v > 0, v / np.float32(p.repeat_penalty),
                              v * np.float32(p.repeat_penalty))
        if p.presence_penalty != 0 or p.frequency_penalty != 0:
            if self._reply is None:
                self._reply = _Counts(self.prompt_len, n_vocab)
            ids = self._reply.sync(context)
            if ids.size:
                z[ids] -= (np.float32(p.frequency_penalty) * self._reply.counts[ids]
                           + np.float32(p.presence_penalty)).astype(np.float32)
        if self._bias_ids.size:
            z[self._bias_ids] += self._bias
        return z


class Sampler:
    """Draws tokens and runs the speculative-decoding acceptance test."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.prompt: list[int] | None = None  # set by `start`
        self._penalties: Penalties | None = None

    def start(self, prompt: Sequence[int]) -> None:
        """A generation begins after `prompt` (the driver calls this): the presence and
        frequency penalties count the tokens after it."""
        self.prompt = list(prompt)
        self._penalties = Penalties(self.params, len(self.prompt)) if self.params.penalised else None

    def penalise(self, logits: np.ndarray, context: Sequence[int] = ()) -> np.ndarray:
        """The row after the repetition penalties (the row itself when there are none).
        `context`: the token ids the row predicts the next token after, prompt included."""
        if not self.params.penalised:
            return logits
        if self._penalties is None:  # not started: the first context is the prompt
            self.start(context)
        assert self._penalties is not None
        return self._penalties.apply(logits, context)

    def prepare(self, logits: np.ndarray, context: Sequence[int] = ()) -> int | np.ndarray:
        """What `draw` and `verify` need from a row that predicts the token after `context`:
        the argmax under greedy decoding, else the distribution; penalties first."""
        logits = self.penalise(logits, context)
        if self.params.greedy:
            return int(np.argmax(logits))
        return distribution(logits, self.params)

    def draw(self, prepared: int | np.ndarray) -> int:
        if isinstance(prepared, int):
            return prepared
        # inverse CDF: rng.choice(n, p=...) re-validates p on every call (1.5 ms over 152k tokens);
        # `prepared` need not sum to 1 (a residual is drawn from unnormalised)
        cdf = np.cumsum(prepared, dtype=np.float64)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return min(i, prepared.shape[0] - 1)

    def verify(
        self, token: int, p: int | np.ndarray, q: int | np.ndarray
    ) -> tuple[bool, int | None]:
        """Speculative test of a draft token x ~ q against the target p.

        Accept with probability min(1, p(x)/q(x)); otherwise return a token drawn from
        norm(max(p - q, 0)). The result is distributed exactly as p. Under greedy decoding p
        and q are one-hot and this reduces to "accept iff the target's argmax is x"."""
        if isinstance(p, int):
            return (True, None) if p == token else (False, p)
        if isinstance(q, int):  # a point mass at x (a deterministic proposal): accept w.p. p(x)
            if self.rng.random() < p[token]:
                return True, None
            residual = p.copy()
            residual[token] = 0.0
            return False, self.draw(residual) if residual.any() else self.draw(p)
        px, qx = p[token], q[token]
        if qx <= 0:  # cannot happen for x ~ q; be safe
            return False, self.draw(p)
        if self.rng.random() < px / qx:
            return True, None
        residual = np.subtract(p, q)
        np.maximum(residual, 0.0, out=residual)
        return False, self.draw(residual) if residual.any() else self.draw(p)
