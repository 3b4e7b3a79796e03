"""The study's rows and columns: feature layouts as one float32 matrix, temperature regimes
and domains as row masks, and the train/calibration/test split by prompt group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import SprinterError

SCALARS = ("max_prob", "entropy", "margin", "logq_x", "q_ratio", "run_position", "since_flag",
           "last_accepted", "last_rejected", "output_position")
# Study features no run-time verifier reads yet: "token" (the drawn token's id, read only through
# a learned token table, TargetEncoder) and "embedding" (the draft's input-embedding row of the
# drawn token, added from the draft GGUF by `training.embeddings`; absent: its candidates skip)
FEATURE_NAMES = ("hidden", *SCALARS, "token", "embedding")
DOMAINS = {0: "code", 1: "chat"}
REGIMES = ("greedy", "sampled")
# regime -> the label AUC is reported on (context only, not the decision)
AUC_LABEL = {"greedy": "label_greedy", "sampled": "label_paper"}


def matrix_of(data: Mapping[str, np.ndarray], layout: Sequence[str],
            rows: np.ndarray | None = None) -> np.ndarray:
    """Columns of `layout` side by side (float32), like `features.feature_matrix`: "hidden"
    expands to its d columns, every other name is one column."""
    missing = [name for name in layout if name not in data]
    unknown = [name for name in layout if name not in FEATURE_NAMES]
    if unknown:
        raise SprinterError(f"unknown feature(s) {', '.join(unknown)}; known: {', '.join(FEATURE_NAMES)}")
    if missing:
        raise SprinterError(f"the data has no column(s) {', '.join(missing)}")
    parts = []
    for name in layout:
        col = np.asarray(data[name]) if rows is None else np.asarray(data[name])[rows]
        parts.append(col.reshape(len(col), -1).astype(np.float32, copy=False))
    return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)


def split_by_group(group: np.ndarray, domain: np.ndarray,
                   fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean row masks (train, calib, test). Groups, not prompts, are split (near-duplicate
    prompts share a group), separately within each domain so both parts see both domains; a
    group spanning domains goes with the domain most of its rows have."""
    group = np.asarray(group)
    domain = np.asarray(domain)
    if group.shape != domain.shape:
        raise SprinterError(f"group {group.shape} and domain {domain.shape} differ in shape")
    if abs(sum(fractions) - 1) > 1e-6 or min(fractions) <= 0:
        raise SprinterError(f"split fractions must be positive and sum to 1, got {fractions}")
    groups, g_idx = np.unique(group, return_inverse=True)
    doms = np.unique(domain)
    counts = np.zeros((len(groups), len(doms)), np.int64)
    np.add.at(counts, (g_idx, np.searchsorted(doms, domain)), 1)
    majority = doms[np.argmax(counts, axis=1)]  # ties: the lower domain code
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for d in doms:
        gs = groups[majority == d]
        if len(gs) == 0:
            continue
        gs = gs[rng.permutation(len(gs))]
        n = len(gs)
        n_cal = max(1, round(n * fractions[1]))
        n_test = max(1, round(n * fractions[2]))
        if n - n_cal - n_test < 1:
            raise SprinterError(f"domain {DOMAINS.get(int(d), d)} has {n} prompt groups: too few for a "
                                "train/calibration/test split (need at least 3)")
        n_train = n - n_cal - n_test
        for k, chunk in enumerate((gs[:n_train], gs[n_train:n_train + n_cal], gs[n_train + n_cal:])):
            parts[k].append(chunk)
    masks = tuple(np.isin(group, np.concatenate(p)) for p in parts)
    return masks  # type: ignore[return-value]


def _regime_mask(data: Mapping[str, np.ndarray], regime: str) -> np.ndarray:
    t = np.asarray(data["temperature"])
    return t == 0 if regime == "greedy" else t > 0


def _domain_masks(data: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    dom = np.asarray(data["domain"])
    out = {DOMAINS.get(int(d), str(int(d))): mask & (dom == d) for d in np.unique(dom[mask])}
    return out | {"all": mask}
