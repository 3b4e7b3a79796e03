"""What a GGUF file's header says about its model, read without touching the weights.

A GGUF file is a header (magic, version, counts, key/value metadata, one entry per tensor: name,
shape, type, offset) and then the tensor data. This reads the header alone, front to back, in
chunks (the tokenizer's arrays are most of it: 1-10 MB for a 50k-250k vocabulary), and keeps
only what a listing needs: architecture, name, size label, parameter count (summed over the
tensor entries), file type, trained context, tokenizer, and a fingerprint of the tokenizer.

The fingerprint covers what llama.cpp's vocabulary load depends on for the loader's own check
(`model_pair.check_same_tokenizer`: vocab size, every token's text, the BOS/EOS/EOT ids): the
tokenizer model and pre-tokenizer names, the explicitly set BOS/EOS/EOT ids and every token's
text. Two files with equal fingerprints pass that check; two that differ may still pass it (an id
set in one file that the other leaves to llama.cpp's default), and are simply not paired.

The tensor entries also say where the data must end, so a truncated file is caught here (its
size is below that end) without reading the data.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import ModelFileError

MAGIC = b"GGUF"
CHUNK = 256 << 10  # bytes per read: a header is read in a few of these
STRING_BATCH = 512  # strings walked between two bounds checks (Reader.strings)
DEFAULT_ALIGNMENT = 32

# GGUF value types: id -> struct format of one scalar (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
            12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")

# llama.h's llama_ftype (general.file_type) -> the name llama.cpp's quantizer gives it
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}
# ggml.h's ggml_type -> (elements per block, bytes per block), for where a tensor's data ends
# (ggml.c's type_traits; a type missing here only weakens the truncation check)
TENSOR_TYPES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
# the special ids llama.cpp's vocabulary check depends on (the rest of the fingerprint: below)
SPECIAL_IDS = ("bos", "eos", "eot")


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


class _Reader:
    """Sequential reads over a file in CHUNK-sized pieces, counting the bytes read."""

    def __init__(self, fh: BinaryIO, size: int):
        self.fh, self.size = fh, size
        self.buf = b""
        self.pos = 0  # into buf
        self.base = 0  # file offset of buf[0]
        self.bytes_read = 0

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def need(self, n: int) -> None:
        if self.pos + n <= len(self.buf):
            return
        if self.base + self.pos + n > self.size:  # (also a corrupt length: never read past the end)
            raise _Truncated
        rest = self.buf[self.pos:]
        self.base += self.pos
        more = self.fh.read(max(n - len(rest), CHUNK))
        self.bytes_read += len(more)
        self.buf, self.pos = rest + more, 0
        if len(self.buf) < n:
            raise _Truncated

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u64(self) -> int:
        return int(self.scalar("<Q"))

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def strings(self, count: int, digest: Any = None) -> None:
        """Walk `count` strings; `digest` (a hashlib object) takes their raw bytes, lengths
        included (so the encoding is unambiguous). The hot loop of a header, one step per token:
        unchecked in batches, a batch that runs past the buffer walked again with checks."""
        unpack = _U64.unpack_from
        done = 0
        while done < count:
            buf, pos, end = self.buf, self.pos, len(self.buf)
            start = pos
            while done < count:
                batch, save = min(STRING_BATCH, count - done), pos
                try:
                    for _ in range(batch):
                        pos += 8 + unpack(buf, pos)[0]
                except struct.error:  # a length past the buffer's end
                    pos = end + 1
                if pos > end:
                    pos = save
                    break
                done += batch
            while done < count and pos + 8 <= end:  # up to the string that crosses the end
                nxt = pos + 8 + unpack(buf, pos)[0]
                if nxt > end:
                    break
                pos, done = nxt, done + 1
            if digest is not None:
                digest.update(memoryview(buf)[start:pos])
            self.pos = pos
            if done < count:  # the next string crosses the chunk's end: read on
                self.need(8)
                self.need(8 + unpack(self.buf, self.pos)[0])

    def skip(self, n: int) -> None:
        self.need(n)
        self.pos += n

    def value(self, vtype: int, keep: bool, digest: Any = None) -> Any:
        """One value of type `vtype`: returned when `keep` (an array: its length), else skipped."""
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            if keep:
                return self.string()
            self.skip(self.u64())
            return None
        if vtype != _ARRAY:
            raise _Corrupt(f"unknown value type {vtype}")
        etype = int(self.scalar("<I"))
        count = self.u64()
        if etype == _STRING:
            self.strings(count, digest)
        elif etype in _SCALARS:
            self.skip(count * struct.calcsize(_SCALARS[etype]))
        else:  # arrays of arrays: none in llama.cpp's files, but legal
            for _ in range(count):
                self.value(etype, False)
        return count


@dataclass(frozen=True)
class GGUFInfo:
    """A GGUF file's header, as far as a listing needs it."""

    path: Path
    file_size: int
    architecture: str | None
    name: str | None
    size_label: str | None  # general.size_label, e.g. "135M", "7B"
    n_params: int | None  # summed over the tensor entries (None: a split file's first part)
    file_type: str | None  # "Q4_K_M", ...; None when the file does not say
    context_length: int | None
    tokenizer_model: str | None  # "gpt2" (BPE), "llama" (SentencePiece), ...
    n_vocab: int | None
    tokenizer: str | None  # the fingerprint (hex); None: the file has no vocabulary
    data_offset: int  # where the tensor data starts: the header's size
    data_end: int  # where the last tensor's data ends (the size the file needs)
    split_count: int = 1
    bytes_read: int = 0  # of the file, to read this (the header, rounded up to a chunk)

    @property
    def complete(self) -> bool:
        return self.split_count > 1 or self.file_size >= self.data_end

    @property
    def params_label(self) -> str | None:
        """"135M", "1.78B": from the count, as llama.cpp counts them (every tensor, an output head
        stored apart from a tied embedding included), else the file's own label."""
        if self.n_params:
            n = self.n_params
            for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
                if n >= div:
                    value = n / div
                    return f"{value:.0f}{unit}" if value >= 100 else f"{value:.3g}{unit}"
            return str(n)
        return self.size_label


def _fingerprint(tokenizer: dict[str, Any], digest: Any) -> str:
    h = hashlib.sha256()
    h.update(repr((tokenizer.get("model"), tokenizer.get("pre"), tokenizer.get("n_vocab"),
                   tuple(tokenizer.get(k) for k in SPECIAL_IDS))).encode())
    h.update(digest.digest())
    return h.hexdigest()


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """The header of the GGUF file at `path` (its weights are never read); ModelFileError with
    one line saying what is wrong for a file that is not GGUF or whose header is cut short."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            size = path.stat().st_size
            reader = _Reader(fh, size)
            try:
                return _read(path, size, reader)
            except _Truncated:
                raise ModelFileError(f"truncated GGUF header: its metadata runs past the file's end at "
                                     f"{size:,} bytes (an interrupted download, or a corrupt file): "
                                     f"{path}") from None
            except _Corrupt as exc:
                raise ModelFileError(f"corrupt GGUF header ({exc}): {path}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read(path: Path, size: int, r: _Reader) -> GGUFInfo:
    r.need(4)
    if r.buf[:4] != MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic {bytes(r.buf[:4])!r}): {path}")
    r.pos = 4
    version = int(r.scalar("<I"))
    if version not in (2, 3):
        raise ModelFileError(f"GGUF version {version} is not supported (2 and 3 are): {path}")
    n_tensors, n_kv = r.u64(), r.u64()
    general: dict[str, Any] = {}
    tokenizer: dict[str, Any] = {}
    arch_keys: dict[str, Any] = {}
    tokens = hashlib.sha256()
    for _ in range(n_kv):
        key = r.string()
        vtype = int(r.scalar("<I"))
        if key == "tokenizer.ggml.tokens":
            tokenizer["n_vocab"] = r.value(vtype, True, tokens)
        elif key.startswith("general."):
            general[key[8:]] = r.value(vtype, True)
        elif key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            tokenizer[key.rsplit(".", 1)[1]] = r.value(vtype, True)
        elif key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            tokenizer[key[len("tokenizer.ggml."):-len("_token_id")]] = r.value(vtype, True)
        elif key.endswith(".context_length") or key == "split.count":
            arch_keys[key] = r.value(vtype, True)
        else:
            r.value(vtype, False)
    n_params, data_end = 0, 0
    for _ in range(n_tensors):
        r.skip(r.u64())  # the name
        n_dims = int(r.scalar("<I"))
        r.need(8 * n_dims)
        dims = struct.unpack_from(f"<{n_dims}Q", r.buf, r.pos)
        r.pos += 8 * n_dims
        ttype, offset = int(r.scalar("<I")), r.u64()
        elements = 1
        for d in dims:
            elements *= d
        n_params += elements
        block, nbytes = TENSOR_TYPES.get(ttype, (1, 0))
        data_end = max(data_end, offset + elements // block * nbytes)
    alignment = general.get("alignment") or DEFAULT_ALIGNMENT
    data_offset = -(-r.offset // alignment) * alignment
    arch = general.get("architecture")
    context = arch_keys.get(f"{arch}.context_length")
    split_count = int(arch_keys.get("split.count") or 1)
    file_type = general.get("file_type")
    return GGUFInfo(
        path=path, file_size=size, architecture=arch, name=general.get("name"),
        size_label=general.get("size_label"),
        n_params=n_params if split_count == 1 and n_tensors else None,
        file_type=FILE_TYPES.get(file_type, f"type {file_type}") if file_type is not None else None,
        context_length=int(context) if context is not None else None,
        tokenizer_model=tokenizer.get("model"), n_vocab=tokenizer.get("n_vocab"),
        tokenizer=_fingerprint(tokenizer, tokens) if "n_vocab" in tokenizer else None,
        data_offset=data_offset, data_end=data_offset + data_end if n_tensors else r.offset,
        split_count=split_count,
        bytes_read=r.bytes_read)
