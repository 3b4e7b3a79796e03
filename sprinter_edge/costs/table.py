"""What a decode call costs on this machine, measured once and cached.

A decode call of n tokens that returns logits for r of them costs c(n, r) milliseconds. The
LM head is a large part of a batch and only the rows asked for pay it, so both c(n, 1) and
c(n, n) are measured; c(n, r) is linear in r between them. Costs depend on the CPU, the
llama.cpp build, the model file, the threads and the GPU layers: the cache key holds all of
them, so any change re-measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)  # the bench's full curve
PLAN_SIZES = (1, 2, 4, 8, 16, 24, 32)  # one logits row: enough to plan catch-ups
# Every size a verification may have (all rows): the curve is not monotone (a call of a multiple
# of 16 tokens can take a faster kernel path than one of 12), and proposal lengths follow it.
FULL_SIZES = tuple(range(1, 33))
FORMAT = 2  # bump when the measurement changes meaning
_TEXT = ("def quicksort(items):\n    if len(items) <= 1:\n        return items\n    pivot = items[0]\n"
         "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. ") * 8


@dataclass
class CostTable:
    """Milliseconds per decode call: `last[n]` with 1 logits row, `full[n]` with n rows."""

    last: dict[int, float] = field(default_factory=dict)
    full: dict[int, float] = field(default_factory=dict)
    _rows: list[float] = field(default_factory=list, repr=False, compare=False)

    def all_rows(self, n: int) -> float:
        """cost(n, n) from a table built once: the lookup proposer asks for it at every length
        on every token, and interpolating each time cost milliseconds."""
        if not self._rows:
            self._rows = [0.0] + [self.cost(i, i) for i in range(1, 65)]
        return self._rows[n] if n < len(self._rows) else self.cost(n, n)

    def cost(self, n: float, rows: float = 1.0) -> float:
        """ms for a call of n tokens returning `rows` logits rows (interpolated)."""
        n = max(1.0, n)
        rows = min(max(rows, 1.0), n)
        c1, cn = _interp(self.last, n), _interp(self.full, n)
        if n <= 1:
            return c1
        return c1 + (cn - c1) * (rows - 1) / (n - 1)

    def to_dict(self) -> dict:
        return {"last_row_ms": {str(k): round(v, 2) for k, v in self.last.items()},
                "all_rows_ms": {str(k): round(v, 2) for k, v in self.full.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> CostTable:
        return cls(last={int(k): float(v) for k, v in data["last_row_ms"].items()},
                   full={int(k): float(v) for k, v in data["all_rows_ms"].items()})

    def make_monotone(self) -> None:
        """A call of more tokens never costs less with one logits row (timing noise otherwise
        makes a 5-token batch look cheaper than a 4-token one), and all rows never cost less
        than one. The all-rows curve keeps its measured dips (see FULL_SIZES)."""
        self._rows = []
        top = 0.0
        for n in sorted(self.last):
            top = self.last[n] = max(self.last[n], top)
        for n in self.full:
            self.full[n] = max(self.full[n], _interp(self.last, n))


def dips(costs: dict[int, float], min_drop: float = 0.05) -> list[tuple[int, int, float, float]]:
    """Where a larger batch costs less than a smaller one, by more than `min_drop` of the
    larger's cost (timing noise stays out): (n, the smaller m that costs most above it, c(n),
    c(m)) for each such n, in order."""
    out = []
    sizes = sorted(costs)
    for i, n in enumerate(sizes):
        dearer = [m for m in sizes[:i] if costs[m] > costs[n] * (1 + min_drop)]
        if dearer:
            m = max(dearer, key=lambda k: costs[k])
            out.append((n, m, costs[n], costs[m]))
    return out


def _interp(table: dict[int, float], n: float) -> float:
    xs = sorted(table)
    if n <= xs[0]:
        return table[xs[0]]
    for a, b in zip(xs, xs[1:], strict=False):
        if n <= b:
            return table[a] + (table[b] - table[a]) * (n - a) / (b - a)
    if len(xs) < 2:
        return table[xs[-1]]
    a, b = xs[-2], xs[-1]  # extrapolate with the last slope
    return table[b] + (table[b] - table[a]) * (n - b) / (b - a)


def measure(model: Any, sizes: Sequence[int] = SIZES, repeats: int = 3,
            full_sizes: Sequence[int] | None = None, *, all_rows: bool = True,
            monotone: bool = True) -> CostTable:
    """Time decode calls of n tokens after a 64-token context, median of `repeats`: with one
    logits row (`last`) at `sizes` and, unless `all_rows` is off, with n rows (`full`) at
    `full_sizes` (default: the same). `monotone` smooths the one-row table for the planner
    (`CostTable.make_monotone`); off, it keeps what was measured, a multiple of 16 that costs
    less than a smaller batch included."""
    full_sizes = (sizes if full_sizes is None else full_sizes) if all_rows else ()
    tokens = model.tokenize(_TEXT)
    context, batch = tokens[:64], tokens[64:]
    longest = max([*sizes, *full_sizes])
    if len(batch) < longest:
        batch = (batch * (longest // max(1, len(batch)) + 1))
    model.sync(context, n_logits=0)
    model.eval(batch[:1], n_logits=1)  # warm-up: the first decode pages the weights in
    table = CostTable()
    calls = [(n, 1, table.last) for n in sizes] + [(n, n, table.full) for n in full_sizes if n > 1]
    for n, rows, dest in calls:
        times = []
        for _ in range(repeats):
            model.rollback(len(context))
            t0 = time.perf_counter()
            model.eval(batch[:n], n_logits=rows)
            times.append((time.perf_counter() - t0) * 1e3)
        dest[n] = sorted(times)[len(times) // 2]
    if all_rows:
        table.full[1] = table.last[1]
    model.rollback(0)
    if monotone:
        table.make_monotone()
    log.info("decode costs measured for %s", getattr(model, "path", model))
    return table


def cache_dir() -> Path:
    root = os.environ.get("SPRINTER_EDGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sprinter-edge")
    return Path(root) / "costs"


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cost_key(model: Any) -> dict[str, Any]:
    """Everything a decode cost depends on."""
    from ..backend import native

    opts = model.options
    return {"format": FORMAT, "llama_cpp": native.llama_cpp_version(), "build": native.system_info(),
            "cpu": cpu_name(), "machine": platform.machine(), "model": model.fingerprint(),
            "threads": opts.threads(), "gpu_layers": opts.n_gpu_layers, "n_batch": opts.n_batch,
            "extra_buffers": not native.avoid_extra_buffers(), "mmap": opts.use_mmap}


def machine_costs(model: Any, sizes: Sequence[int] = PLAN_SIZES, repeats: int = 2,
                  *, refresh: bool = False) -> CostTable:
    """This machine's costs for `model`, from the cache or measured now (a few seconds)."""
    key = cost_key(model)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_dir() / f"{digest}.json"
    if not refresh and path.is_file():
        try:
            data = json.loads(path.read_text())
            table = CostTable.from_dict(data["costs"])
            table.make_monotone()
            return table
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable cost cache %s: %s", path, exc)
    log.info("measuring decode costs of %s (once for this machine, build and model)", model.path.name)
    table = measure(model, sizes, repeats, FULL_SIZES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "costs": table.to_dict()}, indent=1))
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot cache decode costs in %s: %s", path, exc)
    return table
