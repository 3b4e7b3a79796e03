"""The draft's input-embedding row of each drawn token, read straight from its GGUF.

A study feature (issue 11: "the token itself, e.g. the draft's input-embedding row"): it
tells a verifier *which* token was drawn in the draft's own 896-d token space, so a linear
model can learn token classes (brackets, indentation, identifiers) without a table per id.
Rows are dequantised with the `gguf` package (ggml-org's reader), only for the ids asked for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import SprinterError
from ..resources import install_hint

TENSOR = "token_embd.weight"


def token_embedding_rows(gguf_path: str | Path, tokens: np.ndarray) -> np.ndarray:
    """float32 (len(tokens), n_embd): row `tokens[i]` of the model's token-embedding matrix."""
    try:
        from gguf import GGUFReader
        from gguf.quants import dequantize
    except ImportError as exc:  # a study-only dependency (the `study` extra)
        raise SprinterError("the embedding features need the gguf package: "
                            + install_hint("study")) from exc
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    try:
        reader = GGUFReader(str(gguf_path))
    except (OSError, ValueError) as exc:
        raise SprinterError(f"cannot read {gguf_path} as GGUF: {exc}") from exc
    tensor = next((t for t in reader.tensors if t.name == TENSOR), None)
    if tensor is None:
        raise SprinterError(f"{gguf_path} has no {TENSOR} tensor")
    n_vocab = int(tensor.data.shape[0])
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= n_vocab):
        raise SprinterError(f"token ids outside the vocabulary of {Path(gguf_path).name} ({n_vocab})")
    ids, inverse = np.unique(tokens, return_inverse=True)
    rows = np.asarray(dequantize(np.asarray(tensor.data[ids]), tensor.tensor_type), dtype=np.float32)
    return rows.reshape(len(ids), -1)[inverse]
