"""llama-cpp-python as a user would run it: the target alone through
`Llama.create_completion`, the same with its own `draft_model=` hook fed by the pair's
draft GGUF, and with the one draft it ships, `LlamaPromptLookupDecoding` at its defaults
(`max_ngram_size=2, num_pred_tokens=10`: proposals copied from the prompt and reply so far).

llama-cpp-python ships only `LlamaPromptLookupDecoding` for that hook; `GgufDraftModel`
below is the small `LlamaDraftModel` a user writes to plug a draft model in: a second
`Llama` that keeps its KV cache in step with the target's tokens and proposes
`num_pred_tokens` greedy tokens a round. The hook forces `logits_all=True` on the target
(an n_ctx x n_vocab float buffer) and accepts a draft token when the target's sampled
token equals it (no p/q test): under greedy decoding the output is the target's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import native
from ..backend.host import performance_cores
from ..backend.llama import common_prefix

log = logging.getLogger(__name__)


def unavailable_reason() -> str | None:
    """Why the llama-cpp peers cannot run in this process, or None."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a hard dependency
        return f"llama-cpp-python not importable: {exc}"
    if native.avoid_extra_buffers():
        return ("this llama.cpp build uses AMX, which crashes on the first decode here, and "
                "llama_cpp.Llama cannot turn extra buffer types off")
    return None


def _llama(path: Path, n_ctx: int, n_threads: int | None, **kw: Any) -> Any:
    from llama_cpp import Llama

    if kw.get("draft_model") is not None:
        # llama-cpp-python 0.3.36 turns logits_all on for a draft_model but sizes its scores
        # buffer by the logits_all it was given: n_batch rows, and a prompt longer than n_batch
        # fails to broadcast into it. Asking for it explicitly sizes the buffer n_ctx rows.
        kw["logits_all"] = True
    threads = n_threads or performance_cores()  # the engine's default too
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                     n_threads_batch=threads, verbose=False, **kw)


class GgufDraftModel:
    """A `LlamaDraftModel` backed by a draft GGUF (llama-cpp-python ships none)."""

    def __init__(self, path: str | Path, *, num_pred_tokens: int = 4, n_ctx: int = 2048,
                 n_threads: int | None = None, flash_attn: bool = False):
        self.num_pred_tokens = num_pred_tokens
        self.llm = _llama(Path(path), n_ctx, n_threads, flash_attn=flash_attn)
        self.calls = 0
        self.seconds = 0.0

    def _is_eog(self, token: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(self.llm.model), token))

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        import llama_cpp

        t0 = time.perf_counter()
        llm = self.llm
        ids = [int(t) for t in input_ids]
        held = llm.input_ids[: llm.n_tokens].tolist()
        # always decode the last token for fresh logits
        keep = min(common_prefix(held, ids), len(ids) - 1)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), 0, keep, -1)
        llm.n_tokens = keep
        pending = ids[keep:]
        out: list[int] = []
        room = llm.n_ctx() - len(ids) - 1
        for _ in range(max(0, min(self.num_pred_tokens, room))):
            llm.eval(pending)
            last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            logits = np.ctypeslib.as_array(last, shape=(llm.n_vocab(),))
            token = int(logits.argmax())
            out.append(token)
            if self._is_eog(token):
                break
            pending = [token]
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return np.array(out, dtype=np.intc)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.llm.close()


# the hook's declared interface, when available (it is an ABC with __call__ only)
with contextlib.suppress(ImportError):  # pragma: no branch
    from llama_cpp.llama_speculative import LlamaDraftModel

    LlamaDraftModel.register(GgufDraftModel)


@dataclass
class PeerRun:
    tokens: list[int]
    text: str
    new_tokens: int
    prefill_seconds: float  # until the first token arrived (prompt + one decode)
    decode_seconds: float  # after the first token
    total_seconds: float
    finish_reason: str

    @property
    def tokens_per_second(self) -> float:
        """Tokens after the first over the time after the first (eval speed)."""
        return (self.new_tokens - 1) / self.decode_seconds if self.new_tokens > 1 and \
            self.decode_seconds > 0 else 0.0


def prompt_lookup() -> Any:
    """llama-cpp-python's own `LlamaPromptLookupDecoding` at its defaults."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    return LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)


class LlamaCppPeer:
    """One llama-cpp-python `Llama` of the target, optionally with the draft hook: the pair's
    draft GGUF (`draft`) or llama-cpp-python's prompt lookup (`lookup`)."""

    def __init__(self, name: str, target: Path, *, draft: Path | None = None, lookup: bool = False,
                 n_ctx: int = 1024, n_threads: int | None = None, num_pred_tokens: int = 4,
                 flash_attn: bool = False):
        """`flash_attn`: llama-cpp-python's own switch (off unless asked; the engine's setting)."""
        if draft is not None and lookup:
            raise ValueError("a llama-cpp peer drafts with a draft model or by prompt lookup, not both")
        self.name = name
        self.draft = GgufDraftModel(draft, num_pred_tokens=num_pred_tokens, n_ctx=n_ctx,
                                    n_threads=n_threads, flash_attn=flash_attn) if draft else None
        hook = self.draft if self.draft is not None else prompt_lookup() if lookup else None
        self.llm = _llama(target, n_ctx, n_threads, draft_model=hook, flash_attn=flash_attn)

    def generate(self, prompt: list[int], max_tokens: int, stop: tuple[str, ...] = (),
                 temperature: float = 0.0, seed: int | None = None) -> PeerRun:
        """Completion of the prompt tokens (greedy, or sampled from the full distribution at
        `temperature`), streamed to time the first token."""
        llm = self.llm
        llm.reset()  # read the prompt anew, as the engine rows do: comparable TTFT
        t0 = time.perf_counter()
        t_first = None
        text = ""
        finish = ""
        sampling = (dict(temperature=0.0, top_k=1) if temperature <= 0
                    else dict(temperature=temperature, top_k=0, seed=seed))
        for chunk in llm.create_completion(prompt, max_tokens=max_tokens, top_p=1.0, min_p=0.0,
                                           repeat_penalty=1.0, stop=list(stop) or None, stream=True,
                                           **sampling):
            if t_first is None:
                t_first = time.perf_counter()
            choice = chunk["choices"][0]
            text += choice.get("text") or ""
            finish = choice.get("finish_reason") or finish
        t_end = time.perf_counter()
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) if text else []
        t_first = t_first or t_end
        return PeerRun(tokens, text, len(tokens), t_first - t0, t_end - t_first, t_end - t0,
                       finish or "length")

    def close(self) -> None:
        for m in (self.llm, self.draft):
            with contextlib.suppress(Exception):
                if m is not None:
                    m.close()
