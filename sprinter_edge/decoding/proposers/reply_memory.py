"""Earlier replies, a copy source across requests.

An agent's replies recur in shape from one request to the next: the sentence of plan, the file
name and fence that open every whole-file reply, a commit message's form, a summary's headings,
tool-call JSON. A reply of this request is not in the next request's prompt when the client
sends another conversation in between (a summary, a commit message) or drops its history, so
the copy would decode it one step at a time. The engine keeps its recent replies, each behind
the last prompt tokens that led to it (a reply's opening then matches at its first token), and
the copy looks them up after the prompt and the reply, as SuffixDecoding (arXiv 2411.04975)
keeps its tree over earlier outputs. A copied token is checked by the target like every other,
so the output is the one the method gives without them; only the speed changes.

One memory per engine (its target model), within `budget_tokens` in all, oldest dropped first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .prompt_lookup import MAX_MATCH

DEFAULT_TOKENS = 16384  # replies kept, in tokens (leads included): ~10 whole-file replies
LEAD = MAX_MATCH  # prompt tokens kept before each reply: as many as a match compares
MIN_REPLY = 8  # a shorter reply is not worth a place


@dataclass
class ReplyMemory:
    """The recent replies of one engine, each behind the prompt tokens that led to it."""

    budget_tokens: int = DEFAULT_TOKENS
    _replies: deque[tuple[int, ...]] = field(default_factory=deque, repr=False)  # oldest first
    _tokens: int = field(default=0, repr=False)

    def __len__(self) -> int:
        return len(self._replies)

    @property
    def tokens(self) -> int:
        return self._tokens

    def remember(self, prompt: Sequence[int], reply: Sequence[int]) -> None:
        """Keep `reply` behind the last LEAD tokens of `prompt`, dropping the oldest to fit."""
        if len(reply) < MIN_REPLY:
            return
        entry = (*prompt[-LEAD:], *reply)
        if len(entry) > self.budget_tokens:
            return
        if entry in self._replies:  # the same again (a retried request): only its place moves
            self._replies.remove(entry)
            self._tokens -= len(entry)
        while self._replies and self._tokens + len(entry) > self.budget_tokens:
            self._tokens -= len(self._replies.popleft())
        self._replies.append(entry)
        self._tokens += len(entry)

    def replies(self) -> list[tuple[int, ...]]:
        """The kept replies (with their leads), most recent first."""
        return list(reversed(self._replies))

    def clear(self) -> None:
        self._replies.clear()
        self._tokens = 0
