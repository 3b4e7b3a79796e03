"""The KV of recent prompts, kept in RAM across requests (llama-server's `--cache-ram`).

A model holds one KV sequence; `LlamaModel.sync` reuses its longest common prefix with the next
context. A request from another conversation in between overwrites it, and the next turn of the
first conversation reads its whole prompt again. This cache keeps a copy of the state a request
is about to discard (when it discards at least `min_gain` tokens) keyed by the tokens it holds,
and before a model reads a prompt restores the copy that shares the longest prefix with it,
when that beats the live cache by `min_gain` tokens (a restore is a memory copy of the whole
state: a few tokens' prefill is cheaper). Entries are evicted least recently used first, to stay
within a byte budget. A state copy is exact: the restored KV is the one computed before.
"""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from .llama import LlamaModel, common_prefix

log = logging.getLogger(__name__)

MIN_GAIN = 64  # tokens a restore must save over the live cache (and a save must be worth)


@dataclass
class _Entry:
    model: int  # id() of the LlamaModel whose state this is
    tokens: list[int]
    state: ctypes.Array[ctypes.c_uint8]

    @property
    def nbytes(self) -> int:
        return len(self.state)


@dataclass
class PromptCacheStats:
    saved: int = 0  # states kept
    restored: int = 0  # states restored
    restored_tokens: int = 0  # prompt tokens those restores spared a prefill
    evicted: int = 0


@dataclass
class PromptCache:
    """Saved KV states of the models of one engine, within `budget_bytes` in all."""

    budget_bytes: int
    min_gain: int = MIN_GAIN
    stats: PromptCacheStats = field(default_factory=PromptCacheStats)
    _entries: OrderedDict[int, _Entry] = field(default_factory=OrderedDict, repr=False)  # LRU first
    _next: int = field(default=0, repr=False)

    @classmethod
    def of_mib(cls, mib: float) -> PromptCache:
        return cls(int(mib * (1 << 20)))

    @property
    def used_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def forget(self, model: LlamaModel) -> None:
        """Drop `model`'s states (it is being closed)."""
        for key in [k for k, e in self._entries.items() if e.model == id(model)]:
            del self._entries[key]

    def _best(self, model: LlamaModel, prompt: list[int]) -> tuple[int | None, int]:
        """The entry of `model` sharing the longest prefix with `prompt`, and that prefix."""
        best, best_n = None, 0
        for key, e in self._entries.items():
            if e.model == id(model):
                n = common_prefix(e.tokens, prompt)
                if n > best_n:
                    best, best_n = key, n
        return best, best_n

    def reusable(self, model: LlamaModel, prompt: list[int]) -> int:
        """How many tokens of `prompt` `prepare` would leave in `model`'s KV cache."""
        live = common_prefix(model.tokens, prompt)
        _, n = self._best(model, prompt)
        return n if n >= live + self.min_gain else live

    def prepare(self, model: LlamaModel, prompt: list[int]) -> int:
        """Before `model` reads `prompt`: keep the state it is about to discard, and restore the
        saved state that shares the most of `prompt` when that beats the live cache. Returns the
        tokens of `prompt` the KV cache then holds (`sync` reads only the rest)."""
        live = common_prefix(model.tokens, prompt)
        key, n = self._best(model, prompt)
        entry = self._entries[key] if key is not None and n >= live + self.min_gain else None
        if entry is not None:
            self._entries.move_to_end(key)  # type: ignore[arg-type]
        if len(model.tokens) - live >= self.min_gain:
            self._save(model)
        if entry is None:
            return live
        if not model.load_state(entry.state, entry.tokens):
            log.warning("llama.cpp refused a saved KV state of %s: reading the prompt instead",
                        model.path.name)
            self._entries.pop(key, None)  # type: ignore[arg-type]
            return 0
        model.rollback(n)
        self.stats.restored += 1
        self.stats.restored_tokens += n - live
        log.debug("%s: restored %d prompt tokens from the prompt cache (%d were live)",
                  model.path.name, n, live)
        return n

    def _save(self, model: LlamaModel) -> None:
        tokens = list(model.tokens)
        for key, e in list(self._entries.items()):
            if e.model != id(model):
                continue
            n = common_prefix(e.tokens, tokens)
            if n == len(tokens):  # a state already kept holds all of these tokens
                self._entries.move_to_end(key)
                return
            if n == len(e.tokens):  # this one holds more than that state did: it replaces it
                del self._entries[key]
        state = model.save_state()
        if state is None or len(state) > self.budget_bytes:
            return
        used = self.used_bytes
        while self._entries and used + len(state) > self.budget_bytes:
            _, old = self._entries.popitem(last=False)
            used -= old.nbytes
            self.stats.evicted += 1
        self._entries[self._next] = _Entry(id(model), tokens, state)
        self._next += 1
        self.stats.saved += 1
        log.debug("%s: kept the KV of %d tokens (%.1f MiB) in the prompt cache", model.path.name,
                  len(tokens), len(state) / (1 << 20))
