"""Constraints -> token masks over a loaded model's vocabulary, with llguidance.

`tokenizer_for(model)` builds llguidance's token table once per model file (~1 s on a 150k
vocabulary) and `compile(constraint, model)` returns a `Matcher`: the grammar's state as tokens
are consumed, the mask of tokens allowed next (index = llama token id), the tokens the grammar
forces, and rollback for speculation.

The token table differs from `llguidance.llamacpp.lltokenizer_from_vocab` in two ways:

- It owns the llama.cpp vocabulary it points to: llguidance keeps the raw `llama_vocab*` and calls
  `llama_tokenize` on it (fast-forward tokens, `tokenize_str`), so a table cached past the
  model's `close()` would read freed memory. The cache loads the file a second time with
  `vocab_only` (a few MB, no weights) and keeps that for the process's life.
- Only CONTROL tokens (`<|im_end|>`, `<|endoftext|>`) are special (llguidance's 0xFF prefix: they
  never match grammar text and a Lark grammar names them as `<|im_end|>`). llguidance also makes
  special the USER_DEFINED tokens spelled `<...>`, which Qwen's `<tool_call>` and
  `</tool_call>` are: a grammar's "<tool_call>" text would then force `<` `tool` `_call` `>`,
  a spelling the model never writes. llama.cpp tokenizes USER_DEFINED tokens out of plain text
  (even with parse_special off), so as text they match both the one token and the pieces.

Time: every Matcher method that works the grammar (masks, consuming, fast-forward, rollback,
copies) adds its wall time to the matcher's `clock`, shared with its copies, so a reply's grammar
seconds are known whichever part of the decoding loop called it (Timings.grammar_seconds).

End of generation: the table's EOS set is every token llama.cpp calls end-of-generation
(`llama_vocab_is_eog`; Qwen2.5: `<|endoftext|>`, `<|im_end|>` and the FIM end tokens), the set
the decoding loop stops on, so the mask allows all of them exactly where the grammar may end.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import llguidance
import numpy as np

from ..backend import native
from ..backend.native import llama_cpp
from ..errors import GrammarError
from .spec import Constraint, check_grammar, one_line

if TYPE_CHECKING:
    from ..backend.llama import LlamaModel

log = logging.getLogger(__name__)

SPECIAL_MARKER = b"\xff"  # llguidance: a token table entry starting so is a special token
# llguidance's reasons without the parser state and grammar dump (they go in a one-line message)
LIMITS = llguidance.LLParserLimits(verbose_errors=False)
COMPILED_CACHE = 64  # fresh matchers kept per (model, constraint): a request's repeat skips the compile


@dataclass(frozen=True)
class VocabTokenizer:
    """llguidance's token table for one model file, and the vocabulary it points into."""

    llg: llguidance.LLTokenizer
    n_vocab: int  # the model's (llama_vocab_n_tokens): the length of every mask
    eos_ids: tuple[int, ...]  # end-of-generation tokens, allowed where the grammar accepts
    fingerprint: str
    _vocab_model: Any  # the vocab_only llama_model that `llg` calls llama_tokenize on


_tokenizers: dict[str, VocabTokenizer] = {}
_compiled: OrderedDict[tuple[str, Constraint], llguidance.LLMatcher] = OrderedDict()
_lock = threading.Lock()


def _load_vocab(path: str) -> Any:
    native.ensure_backend()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with native.capture_log() as logbuf:
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise GrammarError(f"cannot read the vocabulary of {path}: {logbuf.last_error() or 'load failed'}")
    return model


def build_tokenizer(vocab: Any, n_vocab: int) -> tuple[llguidance.LLTokenizer, tuple[int, ...]]:
    """llguidance's token table from a llama.cpp vocabulary (see the module docstring)."""
    cap = 16 * 1024
    buf = ctypes.create_string_buffer(cap + 1)
    tokens: list[bytes] = []
    eos: list[int] = []
    control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    for tok in range(n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, cap, 0, True)
        if n < 0:
            raise GrammarError(f"token {tok} is longer than {cap} bytes")
        piece = buf.raw[:n]
        if llama_cpp.llama_vocab_get_attr(vocab, tok) & control:
            piece = SPECIAL_MARKER + piece
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            eos.append(tok)
        tokens.append(piece)
    if not eos:
        eos.append(llama_cpp.llama_vocab_eos(vocab))
    fptr = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    llg = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
        tokens=tokens, vocab_ptr=vocab, tokenize_fptr=fptr, eos_token=eos, slices=None)
    return llg, tuple(eos)


def tokenizer_for(model: LlamaModel) -> VocabTokenizer:
    """The llguidance token table of `model`, built on first use and cached per model file."""
    key = model.fingerprint()
    with _lock:
        cached = _tokenizers.get(key)
        if cached is not None:
            return cached
        vocab_model = _load_vocab(str(model.path))
        vocab = llama_cpp.llama_model_get_vocab(vocab_model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        if n_vocab != model.n_vocab:
            llama_cpp.llama_model_free(vocab_model)
            raise GrammarError(f"{model.path.name}: its vocabulary read alone has {n_vocab} tokens, "
                               f"the loaded model {model.n_vocab}")
        llg, eos = build_tokenizer(vocab, n_vocab)
        entry = VocabTokenizer(llg, n_vocab, eos, key, vocab_model)
        _tokenizers[key] = entry
        log.debug("llguidance tokenizer for %s: %d tokens, eos %s", model.path.name, n_vocab, eos)
        return entry


def compile(constraint: Constraint, model: LlamaModel) -> Matcher:
    """A fresh `Matcher` of `constraint` over `model`'s vocabulary (GrammarError if the grammar
    does not compile with this tokenizer, e.g. a special token the vocabulary lacks)."""
    tok = tokenizer_for(model)
    key = (tok.fingerprint, constraint)
    with _lock:
        template = _compiled.get(key)
        if template is not None:
            _compiled.move_to_end(key)
    if template is None:
        grammar = constraint.llguidance_grammar()
        check_grammar(grammar, tok.llg, constraint.describe(), limits=LIMITS)
        template = llguidance.LLMatcher(tok.llg, grammar, log_level=0, limits=LIMITS)
        if template.is_error():
            raise GrammarError(f"invalid {constraint.describe()}: {one_line(template.get_error())}")
        with _lock:
            _compiled[key] = template
            while len(_compiled) > COMPILED_CACHE:
                _compiled.popitem(last=False)
    return Matcher(template.deep_copy(), tok, constraint)


class GrammarClock:
    """Wall seconds spent inside a reply's matcher and its copies. A method that calls another
    (masks_along -> consume) is timed once, at the outer call."""

    __slots__ = ("seconds", "depth")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _timed(method: Callable[Concatenate[Matcher, _P], _R]) -> Callable[Concatenate[Matcher, _P], _R]:
    @functools.wraps(method)
    def timed(self: Matcher, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        clock = self.clock
        if clock.depth:
            return method(self, *args, **kwargs)
        clock.depth = 1
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            clock.seconds += time.perf_counter() - t0
            clock.depth = 0
    return timed


class Matcher:
    """The state of one constraint over one reply. `mask()` is what may come next; `consume`
    moves on; `rollback` undoes the last tokens (speculation: consume a proposal, roll back
    what the target rejected). A token the grammar rejects leaves the state as it was."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: VocabTokenizer,
                 constraint: Constraint, clock: GrammarClock | None = None):
        self._m = matcher
        self.clock = clock if clock is not None else GrammarClock()
        self.tokenizer = tokenizer
        self.constraint = constraint
        self.n_vocab = tokenizer.n_vocab
        self._eos = frozenset(tokenizer.eos_ids)
        self._llg_vocab = tokenizer.llg.vocab_size
        self._bits = np.zeros((self._llg_vocab + 31) // 32, dtype=np.int32)
        self._mask: np.ndarray | None = None  # of the current state; None: not computed yet
        # per consumed token, whether llguidance recorded it (an EOS after the grammar stopped
        # is accepted without entering its history): what rollback must undo there
        self._steps: list[bool] = []

    # ------------------------------------------------------------------ state
    @property
    def position(self) -> int:
        """Tokens consumed."""
        return len(self._steps)

    @_timed
    def accepting(self) -> bool:
        """The grammar may end here: the mask allows the end-of-generation tokens."""
        return self.done() or bool(self._m.is_accepting())

    @_timed
    def done(self) -> bool:
        """Stopped: nothing but end-of-generation may follow."""
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str | None:
        """llguidance's internal failure (a parser limit hit), after which the mask allows only
        end-of-generation; None normally."""
        if not self._m.is_error():
            return None
        return self._m.get_error() or "unknown error"

    # ------------------------------------------------------------------ masks
    def _compute(self) -> np.ndarray:
        if self._mask is None:
            self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            if self._m.is_error():
                log.warning("grammar stopped: %s", one_line(self._m.get_error()))
            bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little",
                                 count=min(self._llg_vocab, self.n_vocab)).view(np.bool_)
            if len(bits) < self.n_vocab:  # token ids llguidance does not know: never allowed
                bits = np.concatenate([bits, np.zeros(self.n_vocab - len(bits), np.bool_)])
            bits.flags.writeable = False
            self._mask = bits
        return self._mask

    @_timed
    def mask(self) -> np.ndarray:
        """bool[n_vocab]: the tokens allowed next (read-only; computed once per state)."""
        return self._compute()

    @_timed
    def allowed(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(self._compute()[token])

    @_timed
    def forced(self) -> int | None:
        """The one token the mask allows, if it allows exactly one."""
        self._compute()
        words = np.flatnonzero(self._bits)
        if len(words) != 1:
            return None
        w = int(self._bits[words[0]]) & 0xFFFFFFFF
        if w & (w - 1):
            return None
        tok = int(words[0]) * 32 + w.bit_length() - 1
        return tok if tok < self.n_vocab else None

    @_timed
    def masks_along(self, tokens: list[int]) -> np.ndarray:
        """bool[len(tokens) + 1, n_vocab]: the mask here and after each of `tokens` (a draft
        the target checks in one batch: row i constrains its logits at draft position i). Rows
        after a token the grammar rejects are all False. The state is left as it was."""
        out = np.zeros((len(tokens) + 1, self.n_vocab), dtype=np.bool_)
        out[0] = self._compute()
        moved = 0
        for i, t in enumerate(tokens):
            if self.consume([t]) != 1:
                break
            moved += 1
            out[i + 1] = self._compute()
        self.rollback(moved)
        return out

    @_timed
    def ff_tokens(self) -> list[int]:
        """llguidance's fast-forward tokens: text the grammar forces from here, tokenized as
        the model would (its last tokens left out where a longer token could span past the
        forced text). Not consumed: `consume` them to move on."""
        if self.done():
            return []
        return list(self._m.compute_ff_tokens())

    # ------------------------------------------------------------------ moving
    @_timed
    def consume(self, tokens: list[int]) -> int:
        """Consume `tokens` in order up to the first one the grammar rejects; returns how many
        were accepted (the state moves over those only)."""
        accepted = 0
        for t in tokens:
            if self._m.is_stopped():  # the grammar ended (or failed): only EOS, as the mask says
                if t not in self._eos:
                    break
                self._steps.append(False)  # nothing for llguidance to undo there
            elif 0 <= t < self.n_vocab and self._m.try_consume_tokens([t]) == 1:
                self._steps.append(True)
            else:
                break
            accepted += 1
        if accepted:
            self._mask = None
        return accepted

    @_timed
    def validate(self, tokens: list[int]) -> int:
        """How many of `tokens` `consume` would accept, leaving the state as it is."""
        n = self.consume(tokens)
        self.rollback(n)
        return n

    @_timed
    def consume_text(self, text: str) -> None:
        """Consume text the reply already holds (a forced prefix written into the prompt);
        GrammarError, state unchanged, if the constraint does not allow it."""
        tokens = self.tokenizer.llg.tokenize_str(text)
        n = self.consume(tokens)
        if n < len(tokens):
            self.rollback(n)
            raise GrammarError(f"the reply's start {text!r} does not fit the {self.constraint.describe()}")

    @_timed
    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens."""
        if n < 0 or n > len(self._steps):
            raise ValueError(f"cannot roll back {n} of {len(self._steps)} tokens")
        if n == 0:
            return
        recorded = sum(self._steps[-n:])
        if recorded and not self._m.rollback(recorded):
            raise GrammarError(f"grammar rollback failed: {one_line(self._m.get_error())}")
        del self._steps[-n:]
        self._mask = None

    def reset(self) -> None:
        self.rollback(len(self._steps))

    @_timed
    def copy(self) -> Matcher:
        """An independent matcher in the same state (to try a proposal without committing)."""
        other = Matcher(self._m.deep_copy(), self.tokenizer, self.constraint, self.clock)
        other._steps = list(self._steps)
        return other

    fork = copy


def apply_mask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Set the logits of disallowed tokens to -inf, in place (float32 [..., n_vocab], mask
    bool [n_vocab]); returns `logits`."""
    if logits.dtype != np.float32:
        raise TypeError(f"logits must be float32, not {logits.dtype}")
    if logits.shape[-1] != mask.shape[-1]:
        raise ValueError(f"logits over {logits.shape[-1]} tokens, mask over {mask.shape[-1]}")
    np.copyto(logits, np.float32(-np.inf), where=~mask)
    return logits
