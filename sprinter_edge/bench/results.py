"""One benchmark from plan to files: which prompts and methods, the cost model, the runs,
the machine they ran on, and the report data (bench.json, bench.md, bench.png).

`select_prompts` and `plan` resolve what to run (the llama-cpp rows may be dropped, with a
note), `run` measures and assembles everything `report` and `plot` write, `write` writes it. The CLI
(`sprinter-edge bench`) only turns flags into a `BenchConfig` and prints.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api import Engine
from ..backend import llama_tools, native
from ..backend.host import performance_cores
from ..costs.table import cpu_name, machine_costs
from ..decoding import STRATEGIES
from ..errors import SprinterError
from ..methods import BASELINE_METHOD, methods
from ..verifiers.base import Verifier
from ..verifiers.loading import resolve_verifier
from . import costmodel, edits, peers, plot, prompts, report, runner, structured, summary
from .llama_server import SERVER_METHODS, server_base

DEFAULTS = dict(humaneval=12, chat=4, explain=2, long=3, max_tokens=128)
QUICK = dict(humaneval=1, chat=1, explain=0, long=0, max_tokens=16, sizes=(1, 2, 4, 8, 16, 32), repeats=1)
# every registered method (ar, the reference, first), the bench's own oracle row, then the peers
DEFAULT_METHODS = (BASELINE_METHOD, *(m for m in methods() if m != BASELINE_METHOD), "oracle", "llama-cpp",
                   "llama-cpp-draft", "llama-cpp-lookup", *SERVER_METHODS)
SERVER_MISSING_NOTE = f"llama-server: not built: {llama_tools.BUILD_HINT}"

BATCH_NOTE = ("sd, lookup, staged, oracle and llama-cpp rows are meant to equal ar under greedy decoding; "
              "llama.cpp's CPU kernels are not batch-invariant (a batch of >= 4 tokens moves logits by up "
              "to ~0.6), so near-ties can flip and exact match can be < 1.")
PEER_TIMING_NOTE = ("llama-cpp tok/s counts tokens after the first over the time after the first "
                    "(prompt and first token excluded, as for the engine rows); its tokens are the "
                    "re-tokenized text.")
SERVER_NOTE = ("llama-server rows: llama.cpp's own server (tools/build_llama_server.sh: the llama.cpp "
               "vendored in the installed llama-cpp-python, the wheel's CMAKE_ARGS), one process per "
               "configuration kept for the run, the same GGUF files, threads and context; prompts sent as "
               "the same token ids, cache_prompt off; tok/s is its timings.predicted_per_second, TTFT its "
               "timings.prompt_ms (the first token comes with the prompt's last batch; the draft reads "
               "the prompt in the same batches), tgt calls/tok inferred from its counters "
               "(predicted_n - 1 - draft_n_accepted calls), draft acc = draft_n_accepted / draft_n; "
               "'vs own plain' is against the plain llama-server row (llama-cpp-python rows: against "
               "llama-cpp).")

STRUCTURED_PEER_NOTE = ("llama-cpp-python rows do not run the structured prompts (they take no JSON schema "
                        "here); llama-server rows get each prompt's schema as `json_schema`.")


@dataclass
class BenchConfig:
    """What to benchmark and how (the CLI's flags, resolved)."""

    methods: Sequence[str] = DEFAULT_METHODS
    thresholds: Sequence[float] | None = None  # sprinter rows; None: the verifier's presets
    presets: Sequence[str] = ("quality", "balanced", "fast")  # which presets, when thresholds is None
    verifiers: Sequence[str] = ()  # more than one: the sprinter rows once per verifier spec
    temperature: float = 0.0  # 0: greedy; else every row samples (prompt i with seed + i)
    seed: int = 0
    humaneval: int = DEFAULTS["humaneval"]  # the first N HumanEval problems
    chat: int = DEFAULTS["chat"]  # built-in chat prompts
    explain: int = DEFAULTS["explain"]  # built-in explanation prompts (the chat group)
    long: int = DEFAULTS["long"]  # long-context answers: a stdlib module pasted, a question on it
    edits: int = 0  # edit tasks: the first N of edits.FUNCTIONS.order (its first 80: the fixed subset)
    edit_kinds: Sequence[str] = ()  # only these edits (empty: all)
    edit_skip: int = 0  # start after this many tasks of the fixed order (held-out tasks)
    file_edits: int = 0  # whole-file edit tasks: the first N of edits.FILES.order
    file_edit_skip: int = 0  # ... after its first K
    file_edit_kinds: Sequence[str] = ()  # only these whole-file edits (empty: all)
    edit_split: str | None = None  # both edit workloads: only this side, "tuning" or "report" (None: both)
    structured: int = 0  # structured-output tasks: the first N of structured.structured_prompts
    prompt_file: str | Path | None = None  # extra prompts
    max_tokens: int = DEFAULTS["max_tokens"]
    humaneval_timeout: float = 10.0
    cost_sizes: Sequence[int] | None = costmodel.SIZES  # batch sizes to time; None: no cost model
    cost_repeats: int = 3
    warmup: bool = True
    rescore: str = "all"  # or "verifier": re-score only runs with unverified tokens (runner.RunConfig)
    peers: bool = True  # the llama-cpp-python and llama-server rows, when requested and available
    threads: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # the methods' own (decoding/settings.py)
    peer_ctx: int = 2048
    server_ctx: int = 4096  # llama-server's context: the engine's
    # llama-server rows' --rpc when the engine's target is on an rpc-server: another one (a
    # ggml-rpc-server serves one client at a time, and the engine's stays connected)
    peer_rpc: tuple[str, ...] = ()
    pair: str | None = None  # the registered pair's name (None: local files)
    command: str = ""  # the command line, for the report


@dataclass
class BenchPlan:
    """The prompts and report rows one run goes through, and what was left out."""

    prompts: list[prompts.BenchPrompt]
    specs: list[runner.MethodSpec]
    notes: list[str] = field(default_factory=list)
    verifiers: dict[str, Verifier] = field(default_factory=dict)  # per-row verifiers, loaded once
    server_binary: Path | None = None  # llama-server, when a server row runs

    @property
    def runs(self) -> int:
        shaped = sum(p.workload == structured.WORKLOAD for p in self.prompts)
        llama_cpp = sum(s.base_method in runner.LLAMA_CPP_METHODS for s in self.specs)
        return len(self.prompts) * len(self.specs) - shaped * llama_cpp  # runner._prompt leaves those out


@dataclass
class BenchOutcome:
    data: dict  # everything bench.json holds
    rows: list[dict]  # one per method (bench.md's table)
    notes: list[str]
    wall_seconds: float


def machine(threads: int | None) -> dict:
    """The machine the numbers were measured on, one line for the report."""
    cpu = cpu_name()
    mem = ""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    cores = os.cpu_count()
    desc = (f"{cpu}, {cores} cores{mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, threads {threads or performance_cores()}")
    return {"description": desc, "cpu": cpu, "cores": cores, "threads": threads or performance_cores()}


def select_prompts(config: BenchConfig) -> list[prompts.BenchPrompt]:
    chosen = prompts.humaneval_prompts(config.humaneval) if config.humaneval else []
    chosen += prompts.chat_prompts(config.chat) if config.chat else []
    chosen += prompts.explain_prompts(config.explain) if config.explain else []
    chosen += prompts.long_prompts(config.long) if config.long else []
    chosen += (edits.FUNCTIONS.prompts(config.edits, config.edit_kinds, config.edit_skip, config.edit_split)
               if config.edits else [])
    chosen += (edits.FILES.prompts(config.file_edits, config.file_edit_kinds, config.file_edit_skip,
                                   config.edit_split) if config.file_edits else [])
    chosen += structured.structured_prompts(config.structured) if config.structured else []
    if config.prompt_file:
        chosen += prompts.load_prompt_file(config.prompt_file)
    if not chosen:
        raise SprinterError("no prompts: use --humaneval N, --chat N, --explain N, --long N, --edits N, "
                            "--file-edits N, --structured N or --prompts FILE")
    return chosen


def plan(engine: Engine, config: BenchConfig,
         bench_prompts: list[prompts.BenchPrompt] | None = None) -> BenchPlan:
    """The prompts (default: `select_prompts`) and rows to run; the llama-cpp rows are
    dropped (with a note) when llama-cpp-python cannot run them, the llama-server rows when
    llama-server is not built (one note), all of them when `config.peers` is off, and the
    rows that draft (one note) when the engine has no draft model."""
    if bench_prompts is None:
        bench_prompts = select_prompts(config)
    methods = list(config.methods)
    notes: list[str] = []
    server_binary = None
    if not config.peers:
        methods = [m for m in methods if server_base(m) not in runner.PEER_METHODS]
    if engine.hardware.target_rpc and any(m in runner.LLAMA_CPP_METHODS for m in methods):
        notes.append("llama-cpp rows skipped: llama-cpp-python's Llama cannot put a target on rpc-servers")
        methods = [m for m in methods if m not in runner.LLAMA_CPP_METHODS]
    server_rows = [m for m in methods if server_base(m) in SERVER_METHODS]
    if engine.hardware.target_rpc and len(server_rows) > len(config.peer_rpc):
        left = server_rows[len(config.peer_rpc):]
        notes.append(f"{', '.join(left)} skipped: an rpc-server serves one client at a time, and --peer-rpc "
                     "names none for them")
        methods = [m for m in methods if m not in left]
    if any(m in runner.LLAMA_CPP_METHODS for m in methods):
        why = peers.unavailable_reason()
        if why:
            notes.append(f"llama-cpp rows skipped: {why}")
            methods = [m for m in methods if m not in runner.LLAMA_CPP_METHODS]
    if any(server_base(m) in SERVER_METHODS for m in methods):
        try:
            server_binary = llama_tools.find_tool("llama-server")
        except llama_tools.ToolsError as exc:
            raise SprinterError(str(exc)) from None
        if server_binary is None:
            notes.append(SERVER_MISSING_NOTE)
            methods = [m for m in methods if server_base(m) not in SERVER_METHODS]
    if engine.draft_path is None:  # one model: the rows that draft are left out, said once
        skipped = [m for m in methods if server_base(m) in runner.all_methods()
                   and runner.MethodSpec(m, server_base(m)).needs_draft]
        if skipped:
            notes.append(f"no draft model: {', '.join(skipped)} skipped")
            methods = [m for m in methods if m not in skipped]
    presets: list[str] = []
    verifiers = ({v: resolve_verifier(v, engine.pair, engine.draft, engine.target) for v in config.verifiers}
                 if set(runner.swept()) & set(methods) and len(config.verifiers) > 1 else {})
    if config.thresholds is None:  # the verifier's named presets, resolved per prompt
        thresholds = []
        if set(runner.swept()) & set(methods):
            vers = list(verifiers.values()) or [engine.verifier]
            presets = [p for p in config.presets if all(p in v.presets for v in vers)]
    else:
        thresholds = list(config.thresholds)
    try:
        specs = runner.expand_methods(methods, thresholds, presets, config.verifiers)
    except ValueError as exc:
        raise SprinterError(f"--methods/--thresholds: {exc}") from None
    return BenchPlan(bench_prompts, specs, notes, verifiers, server_binary)


def run(engine: Engine, config: BenchConfig, bench_plan: BenchPlan,
        progress: Callable[[str], None] | None = None,
        say: Callable[[str], None] = lambda _: None) -> BenchOutcome:
    """Measure the cost model (unless off), run every row on every prompt, summarise.
    `progress` is called after each run with its label; `say` gets status lines."""
    specs = bench_plan.specs
    cost = None
    if config.cost_sizes:
        say("measuring decode costs (batches " + ",".join(map(str, config.cost_sizes)) + ")")
        draft = (costmodel.measure(engine.draft, config.cost_sizes, config.cost_repeats)
                 if engine.draft_path is not None else None)
        target = costmodel.measure(engine.target, config.cost_sizes, config.cost_repeats)
        # how calls grow with the context: the machine's cached depth ratios (measured once)
        for table, model in ((target, engine.target), (draft, engine.draft if draft else None)):
            if table is not None and model is not None:
                table.deep = machine_costs(model, depths=True).deep
        cost = costmodel.CostModel(target, draft)
    cfg = runner.RunConfig(max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed,
                           warmup=config.warmup, rescore=config.rescore,
                           humaneval_timeout=config.humaneval_timeout, threads=config.threads,
                           draft_len=config.settings.get("draft_len", 4), peer_ctx=config.peer_ctx,
                           server_ctx=config.server_ctx, server_binary=bench_plan.server_binary,
                           no_repack=native.avoid_extra_buffers(),
                           flash_attn=engine.target.flash_attn, target_rpc=config.peer_rpc)
    bench = runner.Runner(engine, specs, cfg, verifiers=bench_plan.verifiers)
    t0 = time.perf_counter()
    servers: dict[str, list[str]] = {}
    try:
        records = bench.run(bench_plan.prompts, progress=progress)
        servers = bench.server_commands()
    finally:
        bench.close()
    wall = time.perf_counter() - t0
    notes = list(bench_plan.notes)
    if bench.interrupted:
        notes.append("interrupted: only the prompts that finished are reported")
    rows = summary.summarize(records, specs, cost)
    groups = summary.summarize_groups(records, specs, cost)
    notes += run_notes(rows)
    verifier = (engine.verifier.name if engine.draft_path is not None and any(s.uses_verifier for s in specs)
                else None)  # one model: auto never reads a verifier
    data = {
        "command": config.command,
        "machine": machine(config.threads),
        "config": {"pair": config.pair, "target": str(engine.target_path),
                   "draft": str(engine.draft_path) if engine.draft_path else None,
                   "methods": [s.label for s in specs],
                   "verifier": verifier, "verifiers": list(config.verifiers) or None,
                   "temperature": config.temperature, "seed": config.seed,
                   **config.settings,
                   "max_tokens": config.max_tokens, "prompts": [p.id for p in bench_plan.prompts],
                   "edit_split": config.edit_split, "flash_attn": cfg.flash_attn,
                   "llama_server": {"binary": str(bench_plan.server_binary), "commands": servers}
                   if servers else None,
                   "wall_seconds": round(wall, 1)},
        "cost_model": cost.to_dict() if cost else None,
        "rows": rows, "groups": groups, "notes": notes,
        "runs": [r.to_dict() for r in records],
    }
    return BenchOutcome(data, rows, notes, wall)


def _checks_in_batches(method: str) -> bool:
    """The row's method has the target check proposals in multi-token calls (where near-ties
    can part it from `ar`): every exact method but the baseline, the oracle row, the peers."""
    strategy = STRATEGIES.get(method)
    exact_batched = strategy is not None and strategy.exact and method != BASELINE_METHOD
    return exact_batched or method == runner.ORACLE or method in runner.PEER_METHODS


def run_notes(rows: Sequence[dict]) -> list[str]:
    """What a reader of these rows needs to know to read them right."""
    notes = []
    methods = [summary.base_method_of(r) for r in rows]
    if any(r.get("exact_match") is not None and _checks_in_batches(summary.base_method_of(r)) for r in rows):
        notes.append(BATCH_NOTE)
    if any(m in runner.LLAMA_CPP_METHODS for m in methods):
        notes.append(PEER_TIMING_NOTE)
    if any(m in SERVER_METHODS for m in methods):
        notes.append(SERVER_NOTE)
    if any(r.get("structured_n") for r in rows) and any(m in runner.LLAMA_CPP_METHODS for m in methods):
        notes.append(STRUCTURED_PEER_NOTE)
    return notes


def write(outcome: BenchOutcome, out: Path, title: str) -> tuple[Path, Path, Path]:
    """bench.json, bench.md and bench.png in `out`."""
    json_path, md_path = report.write_report(out, outcome.data, outcome.rows)
    png = plot.plot(outcome.rows, out / "bench.png", title=title, groups=outcome.data.get("groups"))
    return json_path, md_path, png
