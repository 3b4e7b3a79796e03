"""Feature matrices and labels from collected data, in a verifier's feature layout."""

from __future__ import annotations

import numpy as np

from ..errors import SprinterError
from ..verifiers.base import FEATURE_BLOCKS

LABELS = {"greedy": "label_greedy", "paper": "label_paper"}


def feature_matrix(data: dict[str, np.ndarray], layout: tuple[str, ...]) -> np.ndarray:
    """Rows laid out exactly like `verifiers.base.feature_vector` (float32)."""
    parts = []
    for block in layout:
        if block not in FEATURE_BLOCKS:
            raise SprinterError(f"unknown feature block {block!r}")
        col = data[block]
        parts.append(col.astype(np.float32) if col.ndim == 2 else col.astype(np.float32)[:, None])
    return np.concatenate(parts, axis=1)


def labels(data: dict[str, np.ndarray], rule: str) -> np.ndarray:
    if rule not in LABELS:
        raise SprinterError(f"unknown label rule {rule!r}; choose from {', '.join(LABELS)}")
    return data[LABELS[rule]].astype(np.int64)


def split_by_prompt(prompt_index: np.ndarray, fractions: tuple[float, float, float],
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean masks (train, validation, test): every prompt's tokens land in one part."""
    prompts = np.unique(prompt_index)
    rng = np.random.default_rng(seed)
    rng.shuffle(prompts)
    n = len(prompts)
    if n < 3:
        raise SprinterError(f"need tokens from at least 3 prompts to split by prompt, got {n}")
    n_val = max(1, round(n * fractions[1]))
    n_test = max(1, round(n * fractions[2]))
    n_train = n - n_val - n_test
    if n_train < 1:
        raise SprinterError("too few prompts for a train/validation/test split")
    parts = (prompts[:n_train], prompts[n_train : n_train + n_val], prompts[n_train + n_val :])
    return tuple(np.isin(prompt_index, p) for p in parts)  # type: ignore[return-value]
