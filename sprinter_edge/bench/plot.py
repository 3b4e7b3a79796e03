"""The picture: speed ratio against ar vs quality, one point per method/threshold.

Top row, every prompt: agreement with the target's greedy output (ROUGE-L against ar) and
either HumanEval pass@1 (when measured and not the same for every row) or the target's mean
log-probability of the generated tokens. When the run has more than one workload, a second
row has one panel per workload: speed against ar over its prompts, against its
own quality axis (pass@1 for HumanEval when it differs between rows, else ROUGE-L against ar)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .summary import SummaryRow

_COLORS = {"ar": "black", "auto": "tab:brown", "sd": "tab:blue", "sprinter": "tab:red",
           "guarded": "tab:pink", "lookup": "lime", "staged": "gold",
           "oracle": "tab:purple", "draft": "tab:gray", "llama-cpp": "tab:green",
           "llama-cpp-draft": "tab:olive", "llama-cpp-lookup": "tab:cyan",
           "llama-server": "darkgreen", "llama-server-draft": "darkolivegreen",
           "llama-server-draft-tuned": "yellowgreen", "llama-server-ngram-mod": "teal",
           "llama-server-ngram-simple": "darkcyan", "llama-server-ngram-simple-tuned": "cadetblue"}


def _marker(method: str) -> str:
    return "s" if method.startswith("llama-server") else "^" if method.startswith("llama-cpp") else "o"


def quality_axes(rows: Sequence[SummaryRow]) -> list[tuple[str, str]]:
    axes = [("rouge_l", "ROUGE-L against ar (target greedy)")]
    passes = {r.get("pass_at_1") for r in rows if r.get("pass_at_1") is not None}
    if len(passes) > 1:
        axes.append(("pass_at_1", "HumanEval pass@1"))
    else:
        axes.append(("mean_logprob", "target log-prob per generated token"))
    return axes


def group_axis(rows: Sequence[SummaryRow]) -> tuple[str, str]:
    """A workload's quality axis: pass@1 (structured output: the schema-valid share) where it
    tells the rows apart, else ROUGE-L vs ar."""
    valid = {r.get("structured_valid") for r in rows if r.get("structured_valid") is not None}
    if len(valid) > 1:
        return "structured_valid", "schema-valid replies"
    passes = {r.get("pass_at_1") for r in rows if r.get("pass_at_1") is not None}
    return ("pass_at_1", "pass@1") if len(passes) > 1 else ("rouge_l", "ROUGE-L against ar")


def _scatter(ax, rows: Sequence[SummaryRow], key: str, label: str, title: str = "") -> None:  # type: ignore[no-untyped-def]
    from .summary import base_method_of

    for r in rows:
        x, y = r.get(key), r.get("ratio_vs_ar")
        if x is None or y is None:
            continue
        method = base_method_of(r)
        ax.scatter([x], [y], color=_COLORS.get(method, "tab:orange"), marker=_marker(method), s=40, zorder=3)
        ax.annotate(r["method"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.axhline(1.0, color="black", lw=0.6, ls="--")
    ax.set_xlabel(label, fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def plot(rows: Sequence[SummaryRow], path: Path, title: str = "",
         groups: dict[str, list[SummaryRow]] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .summary import group_name

    axes_spec = quality_axes(rows)
    groups = groups if groups and len(groups) > 1 else {}
    ncols = max(len(axes_spec), len(groups))
    nrows = 2 if groups else 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.5 * nrows), dpi=110, squeeze=False)
    for ax, (key, label) in zip(axes[0], axes_spec, strict=False):
        _scatter(ax, rows, key, label, "all prompts" if groups else "")
    for ax, (workload, grows) in zip(axes[1] if groups else [], groups.items(), strict=False):
        key, label = group_axis(grows)
        n = max((r.get("prompts", 0) for r in grows), default=0)
        _scatter(ax, grows, key, label, f"{group_name(workload)} ({n} prompt{'s' if n != 1 else ''})")
    for row in axes:
        row[0].set_ylabel("tokens/s relative to ar (same run)")
    for ax in axes.flat:  # panels nothing was drawn in
        if not ax.has_data():
            ax.set_visible(False)
    fig.suptitle(title or "sprinter-edge: speed vs quality", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
