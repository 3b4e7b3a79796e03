"""The picture: speed ratio against ar vs quality, one point per method/threshold.

Two panels: agreement with the target's greedy output (ROUGE-L against ar) and either
HumanEval pass@1 (when measured and not the same for every row) or the target's mean
log-probability of the generated tokens."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

_COLORS = {"ar": "black", "sd": "tab:blue", "sprinter": "tab:red", "oracle": "tab:purple",
           "draft": "tab:gray", "llama-cpp": "tab:green", "llama-cpp-draft": "tab:olive"}


def quality_axes(rows: Sequence[dict]) -> list[tuple[str, str]]:
    axes = [("rouge_l", "ROUGE-L against ar (target greedy)")]
    passes = {r.get("pass_at_1") for r in rows if r.get("pass_at_1") is not None}
    if len(passes) > 1:
        axes.append(("pass_at_1", "HumanEval pass@1"))
    else:
        axes.append(("mean_logprob", "target log-prob per generated token"))
    return axes


def plot(rows: Sequence[dict], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = quality_axes(rows)
    fig, axes = plt.subplots(1, len(axes_spec), figsize=(11, 4.5), dpi=110, sharey=True)
    for ax, (key, label) in zip(axes, axes_spec, strict=True):
        for r in rows:
            x, y = r.get(key), r.get("ratio_vs_ar")
            if x is None or y is None:
                continue
            ax.scatter([x], [y], color=_COLORS.get(r["kind"], "tab:orange"), s=40, zorder=3)
            ax.annotate(r["method"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        ax.axhline(1.0, color="black", lw=0.6, ls="--")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens/s relative to ar (same run)")
    fig.suptitle(title or "sprinter-edge: speed vs quality", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
