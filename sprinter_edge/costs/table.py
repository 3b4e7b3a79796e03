"""What a decode call costs on this machine, measured once and cached.

A decode call of n tokens that returns logits for r of them costs c(n, r) milliseconds. The
LM head is a large part of a batch and only the rows asked for pay it, so both c(n, 1) and
c(n, n) are measured; c(n, r) is linear in r between them. Costs depend on the CPU, the
llama.cpp build, the model file, the threads and the GPU layers: the cache key holds all of
them, so any change re-measures.

Costs also grow with the context a call attends to: after 2k tokens a step of the default
target costs ~10-65% more than after 64, a 32-row call ~35% more. The curve is measured after
BASE_DEPTH tokens; `CostTable.at(depth)` scales it (its dips kept) by the ratio seen at the
nearest deeper contexts.

First use is quick: one repeat of the sizes a plan needs, after BASE_DEPTH tokens only (seconds,
not the minutes a sweep of deep contexts takes). The table then learns from the calls the
decoder times anyway (`CostTable.learn`: each one is a measurement at its size and depth) and is
stored again, so the depths a user's requests reach are priced from their own calls. The bench
asks for the full measurement (`machine_costs(..., depths=True)`).

A table timed while something else used the CPU must not stick. Timing re-times a call that
costs more than both its neighbours (`_time_calls`), and when a reply's calls run far from what
the table says (DISAGREE) the whole table is rescaled to them at once (`CostTable.learn_calls`),
before the calls refine their own points. `doctor` compares the stored table with calls it
makes now and gives the command that re-times it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # the bench's full curve
PLAN_SIZES = (1, 2, 4, 8, 16, 24, 32)  # one logits row: enough to plan catch-ups
# Every size a verification may have (all rows): the curve is not monotone (a call of a multiple
# of 16 tokens can take a faster kernel path than one of 12), and proposal lengths follow it.
FULL_SIZES = (*range(1, 33), 40, 48, 64)  # up to 64: a long copy may be checked in one call
QUICK_FULL_SIZES = FULL_SIZES[1:]  # first use times each once (a size priced between two timed
# ones chose proposals of the wrong length: on this curve 7 tokens cost 25% less than 8)
BASE_DEPTH = 64  # tokens of context before the timed calls of the full curve
DEPTHS = (512, 1024, 2048, 3072)  # deeper contexts re-timed at a few sizes (those the context holds)
DEPTH_LAST = (1, 4, 16, 32)
DEPTH_FULL = (4, 8, 16, 32, 64)
LEARN_SHALLOW = 192  # calls after fewer tokens of context than this teach the base curve
LEARN_BUCKET = 256  # deeper calls teach the deep table of the nearest multiple of this
LEARN_CAP = 24.0  # a point's weight stops growing here, so it keeps following the machine
# A reply's calls that run, taken together, this far from the table (either way) rescale it
# whole: a table timed under load is 2-3x too dear, call-to-call noise on a quiet machine ~10%
DISAGREE = 1.5
DISAGREE_CALLS = 3  # ... once at least this many calls say so
# ... by at most this factor per reply: a busy machine makes a table a few times too dear, while
# a draft table rescaled 33x too cheap in one step (2026-12-07, cause not found) priced a
# 64-row draft call at 13 ms and nothing corrected the points no call reached
RESCALE_MAX = 8.0
OUT_OF_LINE = 1.25  # a timed call this much dearer than both its neighbours is timed again
FORMAT = 5  # bump when the measurement changes meaning
_TEXT = ("def quicksort(items):\n    if len(items) <= 1:\n        return items\n    pivot = items[0]\n"
         "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. ") * 32


@dataclass
class CostTable:
    """Milliseconds per decode call: `last[n]` with 1 logits row, `full[n]` with n rows."""

    last: dict[int, float] = field(default_factory=dict)
    full: dict[int, float] = field(default_factory=dict)
    # the same calls re-timed after deeper contexts (depth -> a table of a few sizes)
    deep: dict[int, CostTable] = field(default_factory=dict)
    # how many timed calls stand behind each point ("last:4", "full:16") or scale: a point
    # measured once at first use weighs 1, each call the decoder timed adds its count (up to
    # LEARN_CAP)
    weight: dict[str, float] = field(default_factory=dict)
    # a deeper table learned from calls: the whole one-row ("last") and all-rows ("full") curves
    # scaled by one ratio each (the calls at one depth are too few to draw a curve of their own)
    scale: dict[str, float] = field(default_factory=dict)
    depths_measured: bool = False  # the deep tables were swept (not only learned from calls)
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
        """Cost after `depth` over cost after BASE_DEPTH, for a call of n tokens: at each deeper
        table, its learned scale, or the ratio at the sizes it measured, interpolated in n (held
        flat past them); linear in depth between tables."""
        base = getattr(self, which)
        points = [(BASE_DEPTH, 1.0)]
        for d, t in sorted(self.deep.items()):
            deep = getattr(t, which)
            if which in t.scale:
                points.append((d, t.scale[which]))
            elif deep and base:
                ratios = {m: c / max(_interp(base, m), 1e-9) for m, c in deep.items()}
                points.append((d, _interp(ratios, n, flat=True)))
        if len(points) < 2:
            return 1.0
        for (d0, r0), (d1, r1) in zip(points, points[1:], strict=False):
            if depth <= d1:
                return r0 + (r1 - r0) * (depth - d0) / max(d1 - d0, 1)
        (d0, r0), (d1, r1) = points[-2], points[-1]
        return max(r1, r0 + (r1 - r0) * (depth - d0) / max(d1 - d0, 1))

    def learn(self, n: int, rows: int, depth: float, ms: float, count: int = 1) -> None:
        """`count` decode calls of n tokens returning `rows` logits rows after `depth` tokens
        of context took `ms` each on average. Shallow calls refine the point they measure;
        deeper ones the scale of their depth's table (their time over the base curve's), unless
        the deep contexts were swept (`depths_measured`: a sweep times every size). A call with
        some but not all rows measures neither curve and is left out."""
        if not _learnable(n, rows, ms, count):
            return
        which = "last" if rows == 1 else "full"
        if depth < LEARN_SHALLOW:
            curve, key = getattr(self, which), f"{which}:{n}"
            w = self.weight.get(key, 1.0) if n in curve else 0.0
            curve[n] = (curve.get(n, 0.0) * w + ms * count) / (w + count)
            self.weight[key] = min(w + count, LEARN_CAP)
            if n == 1:  # one token: its one row is all its rows
                self.full[1] = self.last[1]
        elif not self.depths_measured and getattr(self, which):
            bucket = max(LEARN_BUCKET, int(round(depth / LEARN_BUCKET)) * LEARN_BUCKET)
            table = self.deep.setdefault(bucket, CostTable())
            ratio = ms / max(_interp(getattr(self, which), n), 1e-9)
            w = table.weight.get(which, 0.0)
            table.scale[which] = (table.scale.get(which, 0.0) * w + ratio * count) / (w + count)
            table.weight[which] = min(w + count, LEARN_CAP)
        self._rows, self._at = [], {}

    def learn_calls(self, calls: Sequence[tuple[int, int, float, float, int]]) -> float:
        """Learn a reply's timed calls, each (n, rows, depth, ms, count) as `learn` takes them.
        Where the calls together disagree with the table by more than DISAGREE (the geometric
        mean of their time over the table's price, weighted by count), the table is first
        rescaled by that ratio: a table timed while the machine was busy is corrected by the
        first reply, not worn off over dozens. A deep call slower than the table is left out of
        that check (the table may not know its depth yet); one faster is not (a deeper context
        never costs less). Returns the ratio seen (1.0: agreed, or too few calls to tell)."""
        usable = [(n, rows, depth, ms, count) for n, rows, depth, ms, count in calls
                  if _learnable(n, rows, ms, count)]
        total = logs = 0.0
        for n, rows, depth, ms, count in usable:
            ratio = ms / max(self.at(int(depth)).cost(n, rows), 1e-9)
            if depth >= LEARN_SHALLOW:
                ratio = min(ratio, 1.0)
            logs += math.log(ratio) * count
            total += count
        seen = math.exp(logs / total) if total >= DISAGREE_CALLS else 1.0
        if not 1 / DISAGREE <= seen <= DISAGREE:
            factor = min(max(seen, 1 / RESCALE_MAX), RESCALE_MAX)
            log.info("decode calls ran %.2fx the stored cost table: rescaled %.2fx", seen, factor)
            self.rescale(factor)
        for call in usable:
            self.learn(*call)
        return seen

    def rescale(self, factor: float) -> None:
        """Every cost times `factor` (the deeper tables' measured costs too; their learned
        scales are ratios to the base curve and stay)."""
        self.last = {n: c * factor for n, c in self.last.items()}
        self.full = {n: c * factor for n, c in self.full.items()}
        for table in self.deep.values():
            table.last = {n: c * factor for n, c in table.last.items()}
            table.full = {n: c * factor for n, c in table.full.items()}
        self._rows, self._at = [], {}

    def replace_with(self, other: CostTable) -> None:
        """Take `other`'s costs in place (every holder of this table sees them)."""
        self.last, self.full, self.deep = dict(other.last), dict(other.full), dict(other.deep)
        self.weight, self.depths_measured = dict(other.weight), other.depths_measured
        self.scale = dict(other.scale)
        self._rows, self._at = [], {}

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
        if self.weight:
            d["weight"] = {k: round(v, 1) for k, v in sorted(self.weight.items())}
        if self.scale:
            d["scale"] = {k: round(v, 4) for k, v in sorted(self.scale.items())}
        if self.depths_measured:
            d["depths_measured"] = True
        return d

    @classmethod
    def from_dict(cls, data: dict) -> CostTable:
        return cls(last={int(k): float(v) for k, v in data["last_row_ms"].items()},
                   full={int(k): float(v) for k, v in data["all_rows_ms"].items()},
                   deep={int(k): cls.from_dict(v) for k, v in data.get("after_depth", {}).items()},
                   weight={str(k): float(v) for k, v in data.get("weight", {}).items()},
                   scale={str(k): float(v) for k, v in data.get("scale", {}).items()},
                   depths_measured=bool(data.get("depths_measured", False)))

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


def _learnable(n: int, rows: int, ms: float, count: int) -> bool:
    """A timed call that measures a curve: tokens, a time, and one logits row or every row."""
    return n >= 1 and count >= 1 and ms > 0 and rows in (1, n)


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


def _interp(table: dict[int, float], n: float, *, flat: bool = False) -> float:
    """table at n, linear between its sizes; past the largest, the last slope (or the last
    value: `flat`)."""
    xs = sorted(table)
    if n <= xs[0]:
        return table[xs[0]]
    for a, b in zip(xs, xs[1:], strict=False):
        if n <= b:
            return table[a] + (table[b] - table[a]) * (n - a) / (b - a)
    if len(xs) < 2 or flat:
        return table[xs[-1]]
    a, b = xs[-2], xs[-1]  # extrapolate with the last slope
    return table[b] + (table[b] - table[a]) * (n - b) / (b - a)


def measure(model: Any, sizes: Sequence[int] = SIZES, repeats: int = 3,
            full_sizes: Sequence[int] | None = None, *, all_rows: bool = True,
            monotone: bool = True, depths: Sequence[int] = (), progress: str | None = None) -> CostTable:
    """Time decode calls of n tokens after a BASE_DEPTH-token context, median of `repeats`: with
    one logits row (`last`) at `sizes` and, unless `all_rows` is off, with n rows (`full`) at
    `full_sizes` (default: the same); then a few sizes again after each of `depths` tokens
    (`CostTable.deep`). `monotone` smooths the one-row table for the planner
    (`CostTable.make_monotone`); off, it keeps what was measured, a multiple of 16 that costs
    less than a smaller batch included. `progress`: a progress bar with this title."""
    from tqdm import tqdm

    full_sizes = (sizes if full_sizes is None else full_sizes) if all_rows else ()
    deep_full = DEPTH_FULL if all_rows else ()
    longest = max([*sizes, *full_sizes, *deep_full])
    tokens = model.tokenize(_TEXT)
    need = max([BASE_DEPTH, *depths]) + longest
    tokens = tokens * (need // max(1, len(tokens)) + 1)
    # the bar counts tokens decoded: the contexts read and every timed call
    work = (max([BASE_DEPTH, *depths]) + repeats * (
        sum(sizes) + sum(n for n in full_sizes if n > 1)
        + len(depths) * (sum(DEPTH_LAST) + sum(n for n in deep_full if n > 1))))
    # (None: shown on a terminal only, so a log or a pipe gets no carriage-return lines)
    with tqdm(total=work, desc=progress, unit="tok", disable=True if progress is None else None,
              leave=False) as bar:
        model.sync(tokens[:BASE_DEPTH], n_logits=0)
        model.eval(tokens[BASE_DEPTH:BASE_DEPTH + 1], n_logits=1)  # warm-up: pages the weights in
        bar.update(BASE_DEPTH)
        table = _time_calls(model, tokens, BASE_DEPTH, sizes, full_sizes, repeats, bar.update)
        if all_rows:
            table.full[1] = table.last[1]
        read = BASE_DEPTH
        for depth in depths:
            model.sync(tokens[:depth], n_logits=0)  # reads only what the context lacks
            bar.update(depth - read)
            read = depth
            table.deep[depth] = _time_calls(model, tokens, depth, DEPTH_LAST, deep_full, repeats, bar.update)
        model.rollback(0)
    table.depths_measured = bool(depths)
    if monotone:
        table.make_monotone()
    log.info("decode costs measured for %s", getattr(model, "path", model))
    return table


def _time_calls(model: Any, tokens: list[int], depth: int, sizes: Sequence[int],
                full_sizes: Sequence[int], repeats: int,
                done: Callable[[int], object] = lambda _: None) -> CostTable:
    """Lower-median ms of decode calls after `depth` tokens of `tokens`: one row at `sizes`, all
    rows at `full_sizes` (the lower of two: anything else on the machine only slows a call, and
    a 64-row call timed once 20% slow made long proposals look dear). A call out of line with
    its neighbours is timed again (`_out_of_line`). `done(n)` after each call."""
    table = CostTable()

    def timed(n: int, rows: int) -> float:
        model.rollback(depth)
        t0 = time.perf_counter()
        model.eval(tokens[depth:depth + n], n_logits=rows)
        done(n)
        return (time.perf_counter() - t0) * 1e3

    calls = [(n, 1, table.last) for n in sizes] + [(n, n, table.full) for n in full_sizes if n > 1]
    for n, rows, dest in calls:
        times = sorted(timed(n, rows) for _ in range(repeats))
        dest[n] = times[(len(times) - 1) // 2]
    for rows_of, curve in ((lambda n: 1, table.last), (lambda n: n, table.full)):
        for n in _out_of_line(curve):
            curve[n] = min(curve[n], *(timed(n, rows_of(n)) for _ in range(2)))
    return table


def _out_of_line(curve: dict[int, float]) -> list[int]:
    """The sizes that cost more than OUT_OF_LINE times both their neighbours': a curve only dips
    (a faster kernel at some sizes), so a peak is something else that used the CPU meanwhile."""
    sizes = sorted(curve)
    return [n for a, n, b in zip(sizes, sizes[1:], sizes[2:], strict=False)
            if curve[n] > OUT_OF_LINE * max(curve[a], curve[b])]


def check_against(model: Any, table: CostTable, repeats: int = 3) -> float:
    """Calls timed now over what `table` prices them at: a step and a 16-row call after
    BASE_DEPTH tokens (geometric mean; 1.0: they agree). `doctor` shows it beside the stored
    table, so a table timed while the machine was busy is seen."""
    now = measure(model, (1,), repeats, (16,), monotone=False)
    return math.sqrt(now.last[1] / max(table.cost(1), 1e-9) * now.full[16] / max(table.all_rows(16), 1e-9))


def depths_for(model: Any) -> tuple[int, ...]:
    """The DEPTHS this model's context holds with room for the largest timed call."""
    n_ctx = getattr(model, "n_ctx", 0)
    return tuple(d for d in DEPTHS if d + max(DEPTH_FULL) <= n_ctx)


def cache_dir() -> Path:
    """Where cost tables are kept: `costs/` under SPRINTER_EDGE_CACHE when it is set (the test
    suite points it at a folder of its own per run), else under the package's cache."""
    from ..resources import cache_dir as package_cache

    root = os.environ.get("SPRINTER_EDGE_CACHE")
    return (Path(root) if root else package_cache()) / "costs"


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

    key = {"format": FORMAT, "llama_cpp": native.llama_cpp_version(), "build": native.system_info(),
           "cpu": cpu_name(), "machine": platform.machine(),
           "threads": options.threads(), "gpu_layers": options.n_gpu_layers, "n_batch": options.n_batch,
           "extra_buffers": not native.avoid_extra_buffers(), "mmap": options.use_mmap,
           "flash_attn": options.flash_attn}
    if options.rpc:  # timed through the network, round trips included: a table per route
        key["rpc"] = list(options.rpc)
    elif options.n_gpu_layers and native.gpu_offload_supported():
        # layers on a GPU: a table per GPU (only then, so the CPU's tables stay valid)
        key["device"] = device_key()
    return key


def device_key() -> str:
    """The GPU the offloaded layers run on, as the cost tables are keyed by it: its name and
    description (e.g. "Metal (Apple M2 Pro)"), or "gpu" where ggml cannot tell."""
    from ..backend import native

    devices = native.gpu_devices()
    return ", ".join(devices) if devices else "gpu"


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
        table = read_costs(cache_dir() / alias["costs"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("no usable cost alias for %s: %s", path, exc)
        return None
    return FileCosts(table, int(alias["n_vocab"]), str(alias["tokenizer"]))


def read_costs(path: Path) -> CostTable:
    """A cached cost table (a file of `cache_dir()`), made monotone as every reader wants it."""
    table = CostTable.from_dict(json.loads(path.read_text())["costs"])
    table.make_monotone()
    return table


def cost_file(model: Any) -> Path:
    """Where the costs of this loaded model are cached."""
    return cache_dir() / f"{_digest(cost_key(model))}.json"


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


LEARN_ENV = "SPRINTER_EDGE_LEARN_COSTS"  # "0": keep the cached tables as measured (reproducible runs)


def learning_on() -> bool:
    """Whether engines refine their cost tables from their calls (on unless LEARN_ENV is "0")."""
    return os.environ.get(LEARN_ENV, "1") != "0"


def store_costs(model: Any, table: CostTable) -> None:
    """Write `table` to the model's cache file (atomically; a failure is logged, not raised)."""
    path = cost_file(model)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": cost_key(model), "costs": table.to_dict()}, indent=1))
        tmp.replace(path)
        _record_file(model, path.name)
    except OSError as exc:
        log.warning("cannot cache decode costs in %s: %s", path, exc)


def prior_costs(target: CostTable, draft_path: Path, target_path: Path) -> CostTable:
    """A draft's costs guessed before it is ever loaded: the target's, scaled by the ratio r of
    the files' sizes (the weights a call streams), and a one-token step by sqrt(r) (it has a
    fixed part that does not shrink with the model; docs/journal.md, "The measurements behind
    the constants"). The engine measures the draft when a plan first loads it."""
    r = min(1.0, draft_path.stat().st_size / max(target_path.stat().st_size, 1))

    def scaled(t: CostTable) -> CostTable:
        return CostTable(last={n: c * (r ** 0.5 if n == 1 else r) for n, c in t.last.items()},
                         full={n: c * (r ** 0.5 if n == 1 else r) for n, c in t.full.items()})

    prior = scaled(target)
    prior.deep = {d: scaled(t) for d, t in target.deep.items()}
    for d, t in target.deep.items():
        prior.deep[d].scale = dict(t.scale)  # a depth's learned ratio holds for a smaller model too
    prior.make_monotone()
    return prior


def machine_costs(model: Any, *, depths: bool = False, refresh: bool = False) -> CostTable:
    """This machine's costs for `model`, from the cache or measured now. A first measurement is
    quick (one repeat of the sizes plans use, after BASE_DEPTH tokens: seconds); the decoder's
    own calls refine it later (`CostTable.learn`). `depths`: also sweep the deeper contexts the
    model holds (DEPTHS; a minute or more on a 2-core CPU), once, for the bench and `doctor`."""
    path = cost_file(model)
    table = None
    if not refresh and path.is_file():
        try:
            table = read_costs(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable cost cache %s: %s", path, exc)
    if table is None:
        log.info("timing decode calls of %s (first use on this machine, build and model)", model.path.name)
        table = measure(model, PLAN_SIZES, 1, QUICK_FULL_SIZES,
                        progress=f"first use: timing {model.path.name}")
    elif not (depths and not table.depths_measured and depths_for(model)):
        _record_file(model, path.name)
        return table
    if depths and depths_for(model):
        swept = measure(model, DEPTH_LAST, 1, DEPTH_FULL, depths=depths_for(model),
                        progress=f"timing {model.path.name} after deeper contexts")
        table.deep.update(swept.deep)
        table.depths_measured = True
        table.make_monotone()
    store_costs(model, table)
    return table
