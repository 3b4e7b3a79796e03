"""`sprinter-edge bench`: SPRINTER against ar, sd, the draft and llama.cpp, with quality."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from .common import add_hardware_args, add_model_args, engine_from

DEFAULTS = dict(humaneval=12, chat=4, max_tokens=128)
QUICK = dict(humaneval=1, chat=1, max_tokens=16, sizes=(1, 2, 4, 8, 16, 32), repeats=1)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="benchmark speed and quality of every decoding method",
        description="Run ar, sd, sprinter (at several thresholds), oracle (sprinter with a "
                    "perfect verifier), draft and llama-cpp-python (plain, and with its draft_model= "
                    "hook) on the same prompts, interleaved prompt by prompt; measure tokens/s, "
                    "target calls, time split, peak memory and quality (HumanEval pass@1, "
                    "ROUGE-L and exact match against ar, target log-prob, eta_FP); predict speed "
                    "from a cost model of this machine; write bench.json, bench.md and bench.png.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    g = p.add_argument_group("what to run")
    g.add_argument("--methods", default="ar,sd,sprinter,oracle,draft,llama-cpp,llama-cpp-draft",
                   help="comma-separated: ar, sd, sprinter, oracle, draft, llama-cpp, "
                        "llama-cpp-draft (ar always runs: it is the reference)")
    g.add_argument("--thresholds", default="presets",
                   help="sprinter verifier thresholds to sweep, comma-separated (one row each); "
                        "'presets' = the verifier's quality/balanced/fast operating points; "
                        "empty = the verifier's default only")
    g.add_argument("--verifier", default="auto",
                   help="sprinter verifier: auto (the pair's trained one, else the confidence "
                        "rule), confidence, always-flag, never-flag, or an .onnx path")
    g.add_argument("--run-cap", type=int, default=20,
                   help="sprinter: longest run kept without the target (0 = no cap)")
    g.add_argument("--draft-len", type=int, default=4,
                   help="sd and the llama-cpp draft hook: draft tokens per round")
    g = p.add_argument_group("prompts")
    g.add_argument("--humaneval", type=int, default=None, metavar="N",
                   help=f"the first N HumanEval problems (0 = none; default {DEFAULTS['humaneval']})")
    g.add_argument("--chat", type=int, default=None, metavar="N",
                   help="N built-in chat prompts, held out from verifier training "
                        f"(0 = none; default {DEFAULTS['chat']})")
    g.add_argument("--prompts", metavar="FILE",
                   help="extra prompts: one per line, or JSONL with a 'prompt' field")
    g.add_argument("--max-tokens", type=int, default=None,
                   help=f"new tokens per prompt (default {DEFAULTS['max_tokens']})")
    g.add_argument("--humaneval-timeout", type=float, default=10.0,
                   help="seconds allowed to each HumanEval program")
    g = p.add_argument_group("run")
    g.add_argument("--quick", action="store_true",
                   help=f"CI-sized: {QUICK['humaneval']} HumanEval + {QUICK['chat']} chat prompt, "
                        f"{QUICK['max_tokens']} tokens, coarse cost model (explicit flags win)")
    g.add_argument("--out", default="bench-out", type=Path,
                   help="directory for bench.json, bench.md and bench.png")
    g.add_argument("--no-peers", action="store_true", help="skip the llama-cpp-python rows")
    g.add_argument("--no-cost-model", action="store_true",
                   help="skip measuring decode costs (no predicted columns)")
    g.add_argument("--no-warmup", action="store_true",
                   help="skip the short untimed warm-up generation of each method")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_hardware_args(p)
    p.set_defaults(func=run, ctx=2048)


def _machine(threads: int | None) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    with contextlib.suppress(ValueError, OSError):
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    cores = os.cpu_count()
    desc = (f"{cpu}, {cores} cores{mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, threads {threads or cores}")
    return {"description": desc, "cpu": cpu, "cores": cores, "threads": threads or cores}


def run(args: argparse.Namespace) -> int:
    from ..bench import costmodel, peers, plot, prompts, report, runner, summary
    from ..errors import SprinterError

    base = QUICK if args.quick else DEFAULTS
    n_he, n_chat, max_tokens = (getattr(args, k) if getattr(args, k) is not None else base[k]
                                for k in ("humaneval", "chat", "max_tokens"))
    sizes, repeats = (QUICK["sizes"], QUICK["repeats"]) if args.quick else (costmodel.SIZES, 3)
    bench_prompts = prompts.humaneval_prompts(n_he) if n_he else []
    bench_prompts += prompts.chat_prompts(n_chat) if n_chat else []
    if args.prompts:
        bench_prompts += prompts.load_prompt_file(args.prompts)
    if not bench_prompts:
        raise SprinterError("no prompts: use --humaneval N, --chat N or --prompts FILE")

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    notes: list[str] = []
    if args.no_peers:
        methods = [m for m in methods if m not in runner.PEER_METHODS]
    elif any(m in runner.PEER_METHODS for m in methods):
        why = peers.unavailable_reason()
        if why:
            notes.append(f"llama-cpp rows skipped: {why}")
            methods = [m for m in methods if m not in runner.PEER_METHODS]
    engine = engine_from(args, method="sd").load()
    try:
        if args.thresholds.strip() == "presets":
            thresholds = sorted(set(engine.verifier.presets.values())) if "sprinter" in methods else []
        else:
            thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
        specs = runner.expand_methods(methods, thresholds)
    except ValueError as exc:
        raise SprinterError(f"--methods/--thresholds: {exc}") from None
    verifier_name = engine.verifier.name if any(s.engine_method == "sprinter" for s in specs) else None

    cost = None
    if not args.no_cost_model:
        print("measuring decode costs (batches " + ",".join(map(str, sizes)) + ")", file=sys.stderr)
        cost = costmodel.CostModel(costmodel.measure(engine.target, sizes, repeats),
                                   costmodel.measure(engine.draft, sizes, repeats))

    cfg = runner.RunConfig(max_tokens=max_tokens, warmup=not args.no_warmup,
                           humaneval_timeout=args.humaneval_timeout, threads=args.threads,
                           draft_len=args.draft_len,
                           peer_ctx=min(args.ctx, 4096))
    bench = runner.Runner(engine, specs, cfg)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(bench_prompts) * len(specs), unit="run", file=sys.stderr)

    def progress(label: str) -> None:  # called after each run
        if bar is not None:
            bar.set_description(label[:40])
            bar.update(1)

    t0 = time.perf_counter()
    try:
        records = bench.run(bench_prompts, progress=progress)
    finally:
        bench.close()
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    if bench.interrupted:
        notes.append("interrupted: only the prompts that finished are reported")
    rows = summary.summarize(records, specs, cost)
    if any(r.get("exact_match") is not None and r["kind"] in ("sd", "oracle", "llama-cpp",
                                                             "llama-cpp-draft") for r in rows):
        notes.append("sd, oracle and llama-cpp rows are meant to equal ar under greedy decoding; "
                     "llama.cpp's CPU kernels are not batch-invariant (a batch of >= 4 tokens moves "
                     "logits by up to ~0.6), so near-ties can flip and exact match can be < 1.")
    if any(r["kind"] in runner.PEER_METHODS for r in rows):
        notes.append("llama-cpp tok/s counts tokens after the first over the time after the first "
                     "(prompt and first token excluded, as for the engine rows); its tokens are the "
                     "re-tokenized text.")
    data = {
        "command": "sprinter-edge " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "machine": _machine(args.threads),
        "config": {"pair": args.pair if not args.target else None, "target": str(engine.target_path),
                   "draft": str(engine.draft_path), "methods": [s.label for s in specs],
                   "verifier": verifier_name, "run_cap": args.run_cap, "draft_len": args.draft_len,
                   "max_tokens": max_tokens, "prompts": [p.id for p in bench_prompts],
                   "wall_seconds": round(wall, 1)},
        "cost_model": cost.to_dict() if cost else None,
        "rows": rows, "notes": notes,
        "runs": [r.to_dict() for r in records],
    }
    json_path, md_path = report.write_report(args.out, data, rows)
    title = f"target {engine.target_path.name}, draft {engine.draft_path.name if engine.draft_path else '-'}"
    png = plot.plot(rows, args.out / "bench.png", title=title)
    engine.close()
    print(report.markdown_table(rows))
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {json_path}, {md_path}, {png} ({wall:.0f} s)")
    return 0

