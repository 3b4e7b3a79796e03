"""What a decode call costs on this machine, measured once and cached.

A decode call of n tokens that returns logits for r of them costs c(n, r) milliseconds. The
LM head is a large part of a batch and only the rows asked for pay it, so both c(n, 1) and
c(n, n) are measured; c(n, r) is linear in r between them. Costs depend on the CPU, the
llama.cpp build, the model file, the threads and the GPU layers: the cache key holds all of
them, so any change re-measures.

Costs also grow with the context a call attends to: after 2k tokens a step of the default
target costs ~10-30% more than after 64, a 32-row call ~35% more. The full curve is measured
after BASE_DEPTH tokens, and a few sizes again at each of DEPTHS; `CostTable.at(depth)` scales
the full curve (its dips kept) by the ratio measured at the nearest depths.
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

SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # the bench's full curve
PLAN_SIZES = (1, 2, 4, 8, 16, 24, 32)  # one logits row: enough to plan catch-ups
# Every size a verification may have (all rows): the curve is not monotone (a call of a multiple
# of 16 tokens can take a faster kernel path than one of 12), and proposal lengths follow it.
FULL_SIZES = (*range(1, 33), 40, 48, 64)  # up to 64: a long copy may be checked in one call
BASE_DEPTH = 64  # tokens of context before the timed calls of the full curve
DEPTHS = (512, 1024, 2048, 3072)  # deeper contexts re-timed at a few sizes (those the context holds)
DEPTH_LAST = (1, 4, 16, 32)
DEPTH_FULL = (4, 8, 16, 32, 64)
FORMAT = 4  # bump when the measurement changes meaning
_TEXT = ("def quicksort(items):\n    if len(items) <= 1:\n        return items\n    pivot = items[0]\n"
         "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. ") * 32


@dataclass
class CostTable:
    """Milliseconds per decode call: `last[n]` with 1 logits row, `full[n]` with n rows."""

    last: dict[int, float] = field(default_factory=dict)
    full: dict[int, float] = field(default_factory=dict)
    # the same calls re-timed after deeper contexts (depth -> a table of a few sizes)
    deep: dict[int, CostTable] = field(default_factory=dict)
    _rows: list[float] = field(default_factory=list, repr=False, compare=False)
    _at: dict[int, CostTable] = field(default_factory=dict, repr=False, compare=False)

    def at(self, depth: int) -> CostTable:
        """The costs after `depth` tokens of context: the base curve scaled, size by size, by
        what the deep measurements show (linear in depth between them, extrapolated past the
        deepest). Cached per 128 tokens of depth (the lookup proposer asks on every token)."""
        if not self.deep or depth <= BASE_DEPTH:
            return self
        key = depth // 128 * 128 + 64
        table = self._at.get(key)
        if table is None:
            table = self._at[key] = CostTable(
                last={n: c * self._ratio(key, n, "last") for n, c in self.last.items()},
                full={n: c * self._ratio(key, n, "full") for n, c in self.full.items()})
        return table

    def _ratio(self, depth: int, n: float, which: str) -> float:
        """Cost after `depth` over cost after BASE_DEPTH, for a call of n tokens."""
        base = getattr(self, which)
        points = [(BASE_DEPTH, 1.0)] + [
            (d, _interp(getattr(t, which), n) / max(_interp(base, n), 1e-9))
            for d, t in sorted(self.deep.items()) if getattr(t, which)]
        if len(points) < 2:
            return 1.0
        for (d0, r0), (d1, r1) in zip(points, points[1:], strict=False):
            if depth <= d1:
                return r0 + (r1 - r0) * (depth - d0) / (d1 - d0)
        (d0, r0), (d1, r1) = points[-2], points[-1]
        return max(r1, r0 + (r1 - r0) * (depth - d0) / (d1 - d0))

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
        c1 = min(c1, cn)  # past the one-row sizes timed, the extrapolation may overshoot
        return c1 + (cn - c1) * (rows - 1) / (n - 1)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"last_row_ms": {str(k): round(v, 2) for k, v in self.last.items()},
                             "all_rows_ms": {str(k): round(v, 2) for k, v in self.full.items()}}
        if self.deep:
            d["after_depth"] = {str(k): t.to_dict() for k, t in sorted(self.deep.items())}
        return d

    @classmethod
    def from_dict(cls, data: dict) -> CostTable:
        return cls(last={int(k): float(v) for k, v in data["last_row_ms"].items()},
                   full={int(k): float(v) for k, v in data["all_rows_ms"].items()},
                   deep={int(k): cls.from_dict(v) for k, v in data.get("after_depth", {}).items()})

    def make_monotone(self) -> None:
        """A call of more tokens never costs less with one logits row (timing noise otherwise
        makes a 5-token batch look cheaper than a 4-token one), and all rows never cost less
        than one where both were measured (one row past the largest timed size is an
        extrapolation: raising a measured 64-row cost to it priced long calls at depth 30%
        high). The all-rows curve keeps its measured dips (see FULL_SIZES)."""
        self._rows, self._at = [], {}
        top = 0.0
        for n in sorted(self.last):
            top = self.last[n] = max(self.last[n], top)
        largest = max(self.last, default=0)
        for n in self.full:
            if n <= largest:
                self.full[n] = max(self.full[n], _interp(self.last, n))
        for table in self.deep.values():
            table.make_monotone()


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
            monotone: bool = True, depths: Sequence[int] = ()) -> CostTable:
    """Time decode calls of n tokens after a BASE_DEPTH-token context, median of `repeats`: with
    one logits row (`last`) at `sizes` and, unless `all_rows` is off, with n rows (`full`) at
    `full_sizes` (default: the same); then a few sizes again after each of `depths` tokens
    (`CostTable.deep`). `monotone` smooths the one-row table for the planner
    (`CostTable.make_monotone`); off, it keeps what was measured, a multiple of 16 that costs
    less than a smaller batch included."""
    full_sizes = (sizes if full_sizes is None else full_sizes) if all_rows else ()
    longest = max([*sizes, *full_sizes, *DEPTH_FULL])
    tokens = model.tokenize(_TEXT)
    need = max([BASE_DEPTH, *depths]) + longest
    tokens = tokens * (need // max(1, len(tokens)) + 1)
    model.sync(tokens[:BASE_DEPTH], n_logits=0)
    model.eval(tokens[BASE_DEPTH:BASE_DEPTH + 1], n_logits=1)  # warm-up: pages the weights in
    table = _time_calls(model, tokens, BASE_DEPTH, sizes, full_sizes, repeats)
    if all_rows:
        table.full[1] = table.last[1]
    for depth in depths:
        model.sync(tokens[:depth], n_logits=0)  # reads only what the context lacks
        table.deep[depth] = _time_calls(model, tokens, depth, DEPTH_LAST, DEPTH_FULL if all_rows else (),
                                        repeats)
    model.rollback(0)
    if monotone:
        table.make_monotone()
    log.info("decode costs measured for %s", getattr(model, "path", model))
    return table


def _time_calls(model: Any, tokens: list[int], depth: int, sizes: Sequence[int],
                full_sizes: Sequence[int], repeats: int) -> CostTable:
    """Lower-median ms of decode calls after `depth` tokens of `tokens`: one row at `sizes`, all
    rows at `full_sizes` (the lower of two: anything else on the machine only slows a call, and
    a 64-row call timed once 20% slow made long proposals look dear)."""
    table = CostTable()
    calls = [(n, 1, table.last) for n in sizes] + [(n, n, table.full) for n in full_sizes if n > 1]
    for n, rows, dest in calls:
        times = []
        for _ in range(repeats):
            model.rollback(depth)
            t0 = time.perf_counter()
            model.eval(tokens[depth:depth + n], n_logits=rows)
            times.append((time.perf_counter() - t0) * 1e3)
        dest[n] = sorted(times)[(len(times) - 1) // 2]
    return table


def depths_for(model: Any) -> tuple[int, ...]:
    """The DEPTHS this model's context holds with room for the largest timed call."""
    n_ctx = getattr(model, "n_ctx", 0)
    return tuple(d for d in DEPTHS if d + max(DEPTH_FULL) <= n_ctx)


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


def _machine_key(options: Any) -> dict[str, Any]:
    """What a decode cost depends on besides the model: build, CPU and load options."""
    from ..backend import native

    return {"format": FORMAT, "llama_cpp": native.llama_cpp_version(), "build": native.system_info(),
            "cpu": cpu_name(), "machine": platform.machine(),
            "threads": options.threads(), "gpu_layers": options.n_gpu_layers, "n_batch": options.n_batch,
            "extra_buffers": not native.avoid_extra_buffers(), "mmap": options.use_mmap}


def cost_key(model: Any) -> dict[str, Any]:
    """Everything a decode cost depends on."""
    return {**_machine_key(model.options), "model": model.fingerprint(),
            "depths": list(depths_for(model))}


def file_key(path: Path, options: Any) -> dict[str, Any]:
    """`cost_key` told from the file and its load options, without loading the model: the file's
    identity stands in for the fingerprint (which needs the loaded weights' shape) and the
    requested context size for the depths (llama.cpp may round the size up)."""
    st = path.stat()
    return {**_machine_key(options), "file": [str(path.resolve()), st.st_size, st.st_mtime_ns],
            "n_ctx": options.n_ctx}


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class FileCosts:
    """A model file's cached costs and what its tokenizer was, found without loading it."""

    table: CostTable
    n_vocab: int
    tokenizer_hash: str


def cached_file_costs(path: Path, options: Any) -> FileCosts | None:
    """The cached costs of the model in `path` loaded with `options`, when an earlier load of the
    same file with the same options recorded them (`machine_costs` does); None otherwise."""
    try:
        alias = json.loads((cache_dir() / "files" / f"{_digest(file_key(path, options))}.json").read_text())
        table = _read_table(cache_dir() / alias["costs"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("no usable cost alias for %s: %s", path, exc)
        return None
    return FileCosts(table, int(alias["n_vocab"]), str(alias["tokenizer"]))


def _read_table(path: Path) -> CostTable:
    """A cached cost table, made monotone as every reader wants it."""
    table = CostTable.from_dict(json.loads(path.read_text())["costs"])
    table.make_monotone()
    return table


def _record_file(model: Any, costs_file: str) -> None:
    """Point the file's load-free key at its cost table, so a later engine can price the model
    without loading it (`cached_file_costs`)."""
    path = cache_dir() / "files" / f"{_digest(file_key(model.path, model.options))}.json"
    if path.is_file():
        return
    record = {"costs": costs_file, "n_vocab": model.n_vocab, "tokenizer": model.tokenizer_hash()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot record the cost table of %s in %s: %s", model.path.name, path, exc)


def machine_costs(model: Any, sizes: Sequence[int] = PLAN_SIZES, repeats: int = 2,
                  *, refresh: bool = False) -> CostTable:
    """This machine's costs for `model`, from the cache or measured now (a few seconds)."""
    key = cost_key(model)
    digest = _digest(key)
    path = cache_dir() / f"{digest}.json"
    if not refresh and path.is_file():
        try:
            table = _read_table(path)
            _record_file(model, path.name)
            return table
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable cost cache %s: %s", path, exc)
    depths = depths_for(model)
    log.warning("measuring decode costs of %s after %s tokens of context (once for this machine, "
                "build and model; up to a minute)", model.path.name,
                ", ".join(str(d) for d in (BASE_DEPTH, *depths)))
    table = measure(model, sizes, repeats, FULL_SIZES, depths=depths)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "costs": table.to_dict()}, indent=1))
        tmp.replace(path)
        _record_file(model, path.name)
    except OSError as exc:
        log.warning("cannot cache decode costs in %s: %s", path, exc)
    return table
