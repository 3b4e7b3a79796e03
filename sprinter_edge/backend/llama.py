"""A small typed layer over llama-cpp-python's low-level API.

One `LlamaModel` is one GGUF model with one context and one KV cache (sequence 0).
It decodes batches of tokens, returns the logits of the last positions asked for and,
when asked, the final hidden state (the state the LM head reads), and rolls the KV cache
back. It keeps `tokens`, the exact token sequence held in the KV cache, so callers can
`sync` a model to any context and only the missing suffix is decoded.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError, ContextOverflowError, ModelFileError
from . import host, loading, native, rpc
from .native import llama_cpp

log = logging.getLogger(__name__)


# the settings of LoadOptions.flash_attn and llama.cpp's flash_attn_type for each
FLASH_ATTN_TYPE = {"auto": -1, "on": 1, "off": 0}
FLASH_ATTN = tuple(FLASH_ATTN_TYPE)


def default_gpu_layers() -> int:
    """The GPU layers a model gets unless told: every one (-1) where this build can put them on a
    GPU here (`native.gpu_offload_supported`), as llama.cpp's own tools, Ollama and LM Studio do;
    none (0) otherwise."""
    return -1 if native.gpu_offload_supported() else 0


@dataclass(frozen=True)
class LoadOptions:
    """Hardware and memory settings for one model."""

    n_ctx: int | None = None  # None: `auto_context` (the trained context, up to AUTO_CTX)
    n_threads: int | None = None  # None: the performance cores (backend/host.py)
    # layers offloaded to Metal/CUDA/Vulkan (-1: all; 0: the CPU); the default: all where the
    # build has a GPU here (`default_gpu_layers`)
    n_gpu_layers: int = field(default_factory=default_gpu_layers)
    n_batch: int = 512
    # Weights read into memory instead of mapped from the file: a faster step (anonymous memory
    # gets huge pages; a mapped file's pages can be reclaimed between calls and fault back in;
    # docs/journal.md, "The measurements behind the constants"). Costs a read at load.
    use_mmap: bool = False
    # Flash attention: "on", "off", or "auto": off where every layer runs on the CPU and llama.cpp
    # repacked the weights, llama.cpp's own choice otherwise. On the CPU it attends query by
    # query: a long call deep in a file is slower with it on, a step the same either way
    # (docs/journal.md, "The measurements behind the constants"). Repacked kernels are not
    # batch-invariant anyway; without repacking they can be (greedy speculation token-identical
    # to ar), and there only with it on.
    flash_attn: str = "auto"
    # rpc-servers (HOST:PORT) that hold every layer, through llama.cpp's RPC backend (backend/rpc.py)
    rpc: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}: {self.flash_attn!r}")

    def threads(self) -> int:
        return self.n_threads or host.performance_cores()

    def flash_attn_type(self, repacked: bool) -> int:
        """llama.cpp's flash_attn_type for a model loaded with these options (-1 auto, 0 off,
        1 on); `repacked`: llama.cpp repacked some of its weights."""
        if self.flash_attn == "auto":
            return FLASH_ATTN_TYPE["off" if repacked and not self.n_gpu_layers else "auto"]
        return FLASH_ATTN_TYPE[self.flash_attn]


@dataclass
class DecodeOutput:
    """Rows are the last `len(logits)` positions of the decoded batch, in order."""

    logits: np.ndarray  # float32 [n_rows, n_vocab]
    hidden: np.ndarray | None  # float32 [n_rows, n_embd] when hidden states were asked for


GGUF_MAGIC = b"GGUF"
# Extra output rows accepted to keep a hidden-state decode in one call (see eval).
HIDDEN_EXTRA_ROWS = 4


def check_gguf_file(path: Path) -> None:
    """Cheap checks before llama.cpp sees the file: exists, readable, GGUF magic."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic {magic!r}): {path}")


# The context a model gets unless told: an agent's request (its system prompt, ~1.5k tokens, a
# file of 2-4k tokens and the whole file back) fits, and the default target's KV cache for it is
# ~450 MiB (28 KiB a token)
AUTO_CTX = 16384
AUTO_CTX_MEMORY = 0.125  # ... unless its KV cache would take more than this share of free memory


def auto_context(model: Any) -> int:
    """The context for a loaded llama.cpp model when none is asked for: its trained context, at
    most AUTO_CTX, and no more than a KV cache (f16) in AUTO_CTX_MEMORY of the free memory holds
    (never under 2048); a multiple of 256."""
    trained = llama_cpp.llama_model_n_ctx_train(model) or AUTO_CTX
    n_embd, n_head = llama_cpp.llama_model_n_embd(model), max(1, llama_cpp.llama_model_n_head(model))
    n_head_kv = llama_cpp.llama_model_n_head_kv(model) or n_head
    per_token = 2 * 2 * llama_cpp.llama_model_n_layer(model) * n_head_kv * (n_embd // n_head)
    return context_for(trained, per_token, host.free_memory())


def context_for(trained: int, kv_bytes_per_token: int, free: int) -> int:
    """`auto_context`'s rule: the trained context, at most AUTO_CTX, no more than a KV cache of
    `kv_bytes_per_token` fits in AUTO_CTX_MEMORY of `free` bytes, never under 2048; a multiple
    of 256."""
    fits = int(free * AUTO_CTX_MEMORY / max(kv_bytes_per_token, 1))
    return max(2048, min(trained, AUTO_CTX, fits)) // 256 * 256


# llama.cpp's load log: where the layers went (a GPU build only) and the devices it uses
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_DEVICE = re.compile(r"using device (\S+) \(([^)]*)\)")


def placement_from_log(lines: list[tuple[int, str]], layers: int) -> tuple[int, int, list[str]]:
    """(layers offloaded, of how many, the devices as "NAME (DESCRIPTION)") from llama.cpp's load
    log. A build with the RPC backend says "offloaded n/m layers to GPU" even where it found no
    device to put them on: without a device, none are offloaded."""
    devices = [f"{m.group(1)} ({m.group(2)})" for _, line in lines if (m := _DEVICE.search(line))]
    found = next((m for _, line in lines if (m := _OFFLOADED.search(line))), None)
    if found is None or not devices:
        return 0, layers, devices
    return int(found.group(1)), int(found.group(2)), devices


class LlamaModel:
    """One GGUF model, one context, one KV sequence."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions | None = None):
        self.path = Path(path)
        self.options = options or LoadOptions()
        check_gguf_file(self.path)
        native.ensure_backend()

        self.rpc_devices: rpc.Devices | None = None
        if self.options.rpc:  # every layer on the rpc-servers
            self.rpc_devices = rpc.Devices(self.options.rpc)
        devices = self.rpc_devices.pointer if self.rpc_devices is not None else None
        model, load_log = loading.load_model(self.path, self.options, devices)
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.repacked = loading.repacked(load_log)
        flash_attn_type = self.options.flash_attn_type(self.repacked)
        # the setting it resolved to, as llama-server's `-fa` spells it
        self.flash_attn = next(k for k, v in FLASH_ATTN_TYPE.items() if v == flash_attn_type)
        try:
            self._ctx = ctx = loading.new_context(model, self.path, self.options,
                                                  self.options.n_ctx or auto_context(model), flash_attn_type)
        except BackendError:
            self.close()
            raise
        self._memory = llama_cpp.llama_get_memory(ctx)
        if self.rpc_devices is not None:
            rpc.note_in_use(self.options.rpc)
            log.info("%s on %s; keepalive on %d sockets", self.path.name,
                     ", ".join(self.rpc_devices.names), self.rpc_devices.keep_alive())
        self._embeddings_on = False

        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(model)
        self.n_layer = llama_cpp.llama_model_n_layer(model)
        # where the layers went, as llama.cpp counts them (the output layer is one): layers on a
        # device of `devices` (a GPU, or rpc-servers), of `layers`
        self.gpu_layers, self.layers, self.devices = placement_from_log(load_log, self.n_layer + 1)
        self.n_ctx = llama_cpp.llama_n_ctx(ctx)
        self.n_batch = self.options.n_batch
        self.bos_id = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos_id = llama_cpp.llama_vocab_eos(self._vocab)
        self.eot_id = llama_cpp.llama_vocab_eot(self._vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.last_decoded = 0  # tokens decoded by the last eval()
        self.decoded_tokens = 0  # tokens decoded since load (what prompt reuse saves shows here)
        self.output_rows = 0  # rows of logits llama.cpp computed so far (what a batch pays for)
        self.tokens: list[int] = []  # exactly what the KV cache holds, positions 0..n-1

        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._piece_cache: dict[int, bytes] = {}
        self._fingerprint: str | None = None
        self._tokenizer_hash: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def placement(self) -> str:
        """Where the layers are, in a few words: "31/31 layers on GPU (Metal)", "on the CPU"."""
        return loading.placement(self.gpu_layers, self.layers, self.devices,
                                 self.options.rpc if self.rpc_devices is not None else ())

    # ------------------------------------------------------------------ metadata
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def tokenizer_hash(self) -> str:
        """Hash of every token's text plus the special ids: equal hashes, same tokenizer."""
        if self._tokenizer_hash is None:
            h = hashlib.sha256()
            h.update(f"{self.n_vocab}|{self.bos_id}|{self.eos_id}|{self.eot_id}".encode())
            for tok in range(self.n_vocab):
                h.update(llama_cpp.llama_vocab_get_text(self._vocab, tok) or b"")
                h.update(b"\0")
            self._tokenizer_hash = h.hexdigest()
        return self._tokenizer_hash

    def fingerprint(self) -> str:
        """Stable id of the weights, cheap to compute: shape metadata plus the file's
        size and the hash of its first and last MiB (the header and the last tensors)."""
        if self._fingerprint is None:
            size = self.path.stat().st_size
            h = hashlib.sha256()
            h.update(f"{self.description}|{self.n_layer}|{self.n_embd}|{self.n_vocab}|{size}".encode())
            with self.path.open("rb") as fh:
                h.update(fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read(1 << 20))
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, special)
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a multi-byte character)."""
        key = token if not special else -token - 1
        cached = self._piece_cache.get(key)
        if cached is not None:
            return cached
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
            piece = buf.raw[:n]
        else:
            piece = self._piece_buf.raw[:n]
        self._piece_cache[key] = piece
        return piece

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special=special) for t in tokens).decode(
            "utf-8", errors="replace"
        )

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return (raw or b"").decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ decoding
    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            llama_cpp.llama_set_embeddings(self._ctx, on)
            self._embeddings_on = on

    def eval(self, tokens: list[int], *, n_logits: int = 1, hidden: bool = False,
             on_progress: Callable[[int, int], None] | None = None) -> DecodeOutput:
        """Append `tokens` to the KV cache in one decode call (several only when longer than
        n_batch) and return the logits (and hidden states) of the last `n_logits` of them.

        `on_progress(read, n)` is called after each decode call with the tokens of `tokens` in
        the KV cache so far and len(tokens) (a long prompt's read, reported as it goes). The
        cache and `tokens` agree after each call, so one that raises leaves what was read."""
        n = len(tokens)
        if n == 0:
            raise BackendError("eval() needs at least one token")
        n_logits = max(0, min(n_logits, n))
        if n_logits > self.n_batch:
            raise BackendError(f"cannot return {n_logits} rows: n_batch is {self.n_batch}")
        start = len(self.tokens)
        if start + n > self.n_ctx:
            raise ContextOverflowError(
                f"context full: {start} + {n} tokens exceed the context size {self.n_ctx} "
                f"of {self.path.name}"
            )
        # Chunks of at most n_batch tokens; the last chunk holds every requested row. With
        # hidden states on, llama.cpp makes EVERY token of the batch an output (logits over
        # the whole vocabulary): beyond a few extra rows, the tokens before the requested
        # ones go in a separate decode with hidden states off.
        last_len = min(n, self.n_batch)
        if hidden and last_len - n_logits > HIDDEN_EXTRA_ROWS:
            last_len = n_logits
        head = n - last_len
        pos = 0
        while pos < head:
            step = min(self.n_batch, head - pos)
            self._decode(tokens[pos : pos + step], start + pos, 0, embeddings=False)
            pos += step
            self._count(tokens[pos - step : pos], pos, n, on_progress)
        self._decode(tokens[head:], start + head, n_logits, embeddings=hidden)
        self._count(tokens[head:], n, n, on_progress)
        self.last_decoded = n

        rows = range(last_len - n_logits, last_len)
        logits = read_rows(llama_cpp.llama_get_logits_ith, self._ctx, rows, self.n_vocab, "logits")
        states = read_rows(llama_cpp.llama_get_embeddings_ith, self._ctx, rows, self.n_embd,
                           "hidden state") if hidden else None
        return DecodeOutput(logits=logits, hidden=states)

    def _count(self, decoded: list[int], read: int, n: int,
               on_progress: Callable[[int, int], None] | None) -> None:
        """A decode call of `eval`'s done: its tokens counted at once (the bookkeeping then holds
        whatever the callback does), then reported (`read` of `n`)."""
        self.tokens.extend(decoded)
        self.decoded_tokens += len(decoded)
        if on_progress is not None:
            on_progress(read, n)

    def _decode(self, tokens: list[int], start: int, n_logits: int, *, embeddings: bool) -> None:
        self._set_embeddings(embeddings)
        batch = self._batch
        n = len(tokens)
        batch.n_tokens = n
        # An rpc-server computes a graph after the call returns, and only a read waits for it: a
        # call with no rows asked (a prompt read) gets its last row, read below, so that its
        # time is its own and not billed to the next call
        read_one = n_logits == 0 and self.rpc_devices is not None
        first_out = n - max(n_logits, read_one)
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_out
        self.output_rows += n if embeddings else max(n_logits, read_one)
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            # Leave the cache as it was before this call.
            llama_cpp.llama_memory_seq_rm(self._memory, 0, len(self.tokens), -1)
            raise BackendError(f"llama_decode failed with code {rc} ({self.path.name})")
        if n_logits == 0:  # a device may still be computing: wait, so that a call's time is its own
            # (a read of the logits, which every other call makes, waits by itself)
            llama_cpp.llama_synchronize(self._ctx)  # a GPU
            if read_one:
                llama_cpp.llama_get_logits_ith(self._ctx, n - 1)  # an rpc-server: only a read waits

    def rollback(self, n: int) -> None:
        """Keep only the first n tokens in the KV cache."""
        if n < len(self.tokens):
            if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1):
                raise BackendError("llama.cpp could not remove tokens from the KV cache")
            del self.tokens[n:]

    def reset(self) -> None:
        self.rollback(0)

    def save_state(self) -> ctypes.Array[ctypes.c_uint8] | None:
        """A copy of the KV cache's state (what `tokens` describes), or None when llama.cpp
        gives none."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        if size <= 0:
            return None
        buf = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, 0) != size:
            return None
        return buf

    def load_state(self, state: ctypes.Array[ctypes.c_uint8], tokens: list[int]) -> bool:
        """Replace the KV cache with a state `save_state` took when it held `tokens`. False when
        llama.cpp refuses it: the cache is then empty."""
        llama_cpp.llama_memory_seq_rm(self._memory, 0, -1, -1)
        self.tokens = []
        if not llama_cpp.llama_state_seq_set_data(self._ctx, state, len(state), 0):
            llama_cpp.llama_memory_seq_rm(self._memory, 0, -1, -1)
            return False
        self.tokens = list(tokens)
        return True

    def sync(self, context: list[int], *, n_logits: int = 1, hidden: bool = False,
             on_progress: Callable[[int, int], None] | None = None) -> DecodeOutput:
        """Make the KV cache hold exactly `context` and return the last `n_logits` rows.

        Reuses the longest common prefix already in the cache; the rows asked for are
        always decoded anew (llama.cpp keeps no logits of earlier calls). `on_progress`: as
        `eval`'s, over the tokens it reads (not called when it reads none)."""
        keep = min(common_prefix(self.tokens, context), len(context) - n_logits)
        self.rollback(keep)
        if keep == len(context):
            self.last_decoded = 0
            return DecodeOutput(np.empty((0, self.n_vocab), np.float32), None)
        return self.eval(context[keep:], n_logits=n_logits, hidden=hidden, on_progress=on_progress)


def read_rows(getter: Any, ctx: Any, rows: range, width: int, what: str) -> np.ndarray:
    """The rows of the last decode's batch at `rows` (`getter`: llama.cpp's reader of a row, of
    logits or hidden states), float32 [len(rows), width]."""
    out = np.empty((len(rows), width), dtype=np.float32)
    for r, i in enumerate(rows):
        ptr = getter(ctx, i)
        if not ptr:
            raise BackendError(f"llama.cpp returned no {what}")
        out[r] = np.ctypeslib.as_array(ptr, shape=(width,))
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (the cache is a prefix of the context): one C-level compare
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
