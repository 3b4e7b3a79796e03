"""The picture: speed ratio against ar vs quality, one point per method/threshold."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

_COLORS = {"ar": "black", "sd": "tab:blue", "sprinter": "tab:red", "oracle": "tab:purple",
           "draft": "tab:gray", "llama-cpp": "tab:green", "llama-cpp-draft": "tab:olive"}


def quality_axis(rows: Sequence[dict]) -> tuple[str, str]:
    """HumanEval pass@1 when it was measured, else ROUGE-L against ar."""
    if any(r.get("pass_at_1") is not None for r in rows):
        return "pass_at_1", "HumanEval pass@1"
    return "rouge_l", "ROUGE-L against the target's greedy output (ar)"


def plot(rows: Sequence[dict], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, label = quality_axis(rows)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for r in rows:
        x, y = r.get(key), r.get("ratio_vs_ar")
        if x is None or y is None:
            continue
        ax.scatter([x], [y], color=_COLORS.get(r["kind"], "tab:orange"), s=40, zorder=3)
        ax.annotate(r["method"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.axhline(1.0, color="black", lw=0.6, ls="--")
    ax.set_xlabel(label)
    ax.set_ylabel("tokens/s relative to ar (same run)")
    ax.set_title(title or "sprinter-edge: speed vs quality", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
