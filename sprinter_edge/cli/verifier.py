"""`sprinter-edge verifier collect|train|study|calibrate`: make, compare and inspect a pair's
verifier."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import SprinterError
from ..verifiers.calibration import (
    PRESET_MAX_FP,
    drift_line,
    row_at,
    threshold_for_max_fp,
    with_greedy_drift,
)
from .common import add_hardware_args, add_model_args, engine_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verifier", help="collect data, train, export and calibrate a verifier",
                       description="Make the SPRINTER verifier of a draft/target pair.")
    vsub = p.add_subparsers(dest="verifier_command", metavar="ACTION")

    c = vsub.add_parser("collect", help="run the pair on a prompt corpus and save training data",
                        description="--policy draft-greedy: greedy draft continuations + one target "
                                    "call per prompt. --policy sprinter: SPRINTER's own trajectories "
                                    "(the pair's verifier at its balanced threshold) at each "
                                    "--temperatures, every drafted token labelled by the target. "
                                    "Saves .npz shards (resumable).")
    _collect_args(c)
    add_model_args(c)
    c.set_defaults(func=run_collect)

    t = vsub.add_parser("train", help="train, select, calibrate and export a verifier to ONNX",
                        description="Trains on the data in --data (collecting it first when "
                                    "--collect is given), compares with the confidence rule on "
                                    "held-out prompts and writes an .onnx file.")
    _collect_args(t)
    add_model_args(t)
    t.add_argument("--out", required=True, type=Path, help="the .onnx file to write")
    t.add_argument("--collect", action="store_true",
                   help="collect (or resume collecting) into --data first, within --time-budget")
    t.add_argument("--label", choices=("greedy", "paper"), default="greedy",
                   help="label rule: greedy (draft argmax == target argmax; default) or paper "
                        "(q(x) <= p(x))")
    t.add_argument("--models", default=None,
                   help="comma-separated candidate names (default: all; see training/models.py)")
    t.add_argument("--report", type=Path, default=None, help="also write the full report as JSON here")
    t.add_argument("--split-seed", type=int, default=0, help="seed of the split by prompt")
    t.set_defaults(func=run_train)

    s = vsub.add_parser("study", help="compare verifier candidates with the confidence rule at "
                                      "equal target cost (on-policy data)",
                        description="Splits on-policy data (`collect --policy sprinter`) by prompt "
                                    "group, fits every candidate per temperature regime, replays "
                                    "each along the collected trajectories with this machine's "
                                    "target costs, and reports false passes at the confidence "
                                    "rule's target milliseconds per token, with bootstrap "
                                    "intervals over prompt groups, per domain; then per-domain "
                                    "presets from the calibration groups checked on the test ones.")
    s.add_argument("--data", type=Path, required=True, help="directory of on-policy shards")
    s.add_argument("--out", type=Path, default=Path("verifier-study.json"),
                   help="report JSON (default: %(default)s); a .md twin is written beside it")
    s.add_argument("--candidates", default=None,
                   help="comma-separated candidate names (default: all; see training/study/candidates.py)")
    s.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (default: %(default)s)")
    s.add_argument("--split-seed", type=int, default=0, help="seed of the split by group")
    s.add_argument("--run-cap", type=int, default=16, help="run cap replayed (default: %(default)s)")
    s.add_argument("--costs", choices=("machine", "reference"), default="machine",
                   help="target cost per catch-up: this machine's measured table for the pair's "
                        "target (cached; loads the target once) or the reference table in "
                        "training/study/replay.py (default: %(default)s)")
    s.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="skip the remaining candidates after this many minutes")
    s.add_argument("--ship", default=None, metavar="CANDIDATE",
                   help="also export this candidate to --export: fitted on the train groups, "
                        "presets per sampling regime and domain from the calibration groups, "
                        "checked on the test groups")
    s.add_argument("--export", type=Path, default=None, help="the .onnx file --ship writes")
    add_model_args(s)
    add_hardware_args(s, ctx_default=4096)
    s.set_defaults(func=run_study)

    k = vsub.add_parser("calibrate", help="print a verifier's held-out calibration table and "
                                          "the threshold for an operating point",
                        description="Reads the table stored in a verifier file.")
    k.add_argument("file", type=Path, nargs="?", default=None,
                   help="verifier .onnx file (default: the --pair's shipped verifier)")
    k.add_argument("--pair", default="default", help="pair whose shipped verifier to read")
    k.add_argument("--max-fp-rate", type=float, default=None,
                   help="largest acceptable eta_FP (fraction of wrong draft tokens passed)")
    k.add_argument("--preset", choices=tuple(PRESET_MAX_FP), default=None,
                   help="a named operating point: " + ", ".join(
                       f"{n} (eta_FP <= {v:g})" for n, v in PRESET_MAX_FP.items()))
    k.add_argument("--all", action="store_true", help="print every row of the table")
    k.add_argument("--json", action="store_true", help="print the table and choice as JSON")
    k.set_defaults(func=run_calibrate)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _collect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, required=True, help="directory of the collected shards")
    p.add_argument("--prompts", type=Path, default=None,
                   help="prompt corpus JSONL (default: the shipped sprinter-edge corpus)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="draft tokens per prompt (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="use at most this many prompts")
    p.add_argument("--shard-size", type=int, default=4, help="prompts per shard (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="prompt order seed (default: %(default)s)")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="stop collecting after this many minutes (rerun to resume)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--policy", choices=("draft-greedy", "sprinter"), default="draft-greedy",
                   help="whose trajectories: the draft's greedy continuation (default) or SPRINTER's "
                        "own decoding (on-policy; what `verifier study` needs)")
    p.add_argument("--temperatures", default="0,0.7",
                   help="--policy sprinter: one trajectory per prompt at each of these sampling "
                        "temperatures (default: %(default)s)")
    p.add_argument("--run-cap", type=int, default=16,
                   help="--policy sprinter: the decoder's run cap (default: %(default)s, auto's)")
    p.add_argument("--verifier", default="auto",
                   help="--policy sprinter: the behaviour verifier that decodes the trajectories "
                        "(auto, confidence, hidden or an .onnx path; default: %(default)s)")
    p.add_argument("--threshold", type=float, default=None,
                   help="--policy sprinter: the behaviour verifier's threshold (default: its "
                        "balanced preset). A resumed collection must keep verifier and threshold")
    add_hardware_args(p, ctx_default=4096)
    p.set_defaults(ctx=2048)


def _do_collect(args: argparse.Namespace, budget_s: float | None) -> None:
    from ..training.collect import CollectConfig, collect
    from ..training.corpus import load_corpus
    from ..training.onpolicy import Behaviour
    from ..verifiers.operating_point import OperatingPoint

    engine = engine_from(args, method="ar", with_draft=True)
    corpus = load_corpus(args.prompts)
    policy = getattr(args, "policy", "draft-greedy")
    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError as exc:
        raise SprinterError(f"--temperatures takes numbers like 0,0.7, not {args.temperatures!r}") from exc
    if policy == "sprinter" and (not temps or any(t < 0 for t in temps)):
        raise SprinterError("--temperatures needs one or more temperatures >= 0")
    behaviour = None
    if policy == "sprinter":
        point = (OperatingPoint(threshold=args.threshold) if args.threshold is not None
                 else OperatingPoint(preset="balanced"))
        behaviour = Behaviour(engine.verifier, engine.threshold(point), args.run_cap)
    cfg = CollectConfig(max_new_tokens=args.max_new_tokens, shard_size=args.shard_size, seed=args.seed,
                        limit=args.limit, time_budget_s=budget_s, policy=policy,
                        temperatures=temps if policy == "sprinter" else (0.0,),
                        run_cap=args.run_cap if policy == "sprinter" else CollectConfig.run_cap)
    s = collect(engine.draft, engine.target, corpus, args.data, cfg, behaviour=behaviour,
                progress=not args.no_progress)
    engine.close()
    print(f"collected {s.tokens} tokens from {s.prompts} prompts in {s.seconds:.0f} s "
          f"({s.shards_written} new shards, {s.shards_skipped} already there"
          f"{'; stopped by the time budget' if s.stopped_by_budget else ''})")


def run_collect(args: argparse.Namespace) -> int:
    _do_collect(args, args.time_budget * 60 if args.time_budget else None)
    return 0


def run_train(args: argparse.Namespace) -> int:
    from ..training.ship import train_and_export
    from ..training.train import TrainConfig, report_markdown, table_markdown

    t0 = time.monotonic()
    budget = args.time_budget * 60 if args.time_budget else None
    if args.collect:
        # keep ~2 minutes of the budget for training and export
        _do_collect(args, max(budget - 120, 60) if budget else None)
    left = budget - (time.monotonic() - t0) if budget else None
    cfg = TrainConfig(label=args.label, seed=args.split_seed,
                      candidates=tuple(args.models.split(",")) if args.models else None,
                      time_budget_s=max(left, 30) if left else None)
    pair_name = None
    if not args.target:
        from ..catalog.registry import load_registry

        pair_name = load_registry().pair(args.pair).name
    result, report = train_and_export(args.data, args.out, cfg, pair_name=pair_name)
    print(report_markdown(report))
    print()
    print(table_markdown(result.table))
    print()
    print(f"shipped {report['chosen']} -> {args.out} ({report['onnx_bytes']} bytes, ONNX parity "
          f"{report['onnx_parity_max_abs_diff']:.1e}); presets {result.presets}; "
          f"default threshold {result.default_threshold:g}")
    print(drift_line(row_at(result.table, result.default_threshold), result.tv_pq))
    if args.report:
        args.report.write_text(json.dumps(report, indent=2, default=float))
    return 0


def _wants_embedding(names: tuple[str, ...] | None) -> bool:
    from ..training.study import CANDIDATES, candidate

    cands = [candidate(n) for n in names] if names else list(CANDIDATES)
    return any("embedding" in c.layout for c in cands)


def _draft_embeddings(engine: Any, meta: dict[str, Any], tokens: Any) -> Any:
    """The draft's input-embedding rows of the drawn tokens, from the very draft the data
    was collected with (checked by fingerprint)."""
    from ..training.embeddings import token_embedding_rows

    want = meta.get("pair", {}).get("draft", {})
    got = engine.draft.fingerprint()
    if want.get("fingerprint") != got:
        raise SprinterError(f"the data was collected with draft {want.get('file')} "
                            f"({want.get('fingerprint')}), not {engine.draft_path.name} ({got}): "
                            "pass the same --pair or --draft/--target")
    return token_embedding_rows(engine.draft_path, tokens)


def run_study(args: argparse.Namespace) -> int:
    from ..training.collect import load_data
    from ..training.study import StudyConfig, report_markdown, run_study

    data, meta = load_data(args.data)
    if "accept_prob" not in data:
        raise SprinterError(f"{args.data} holds draft-greedy data: the study needs on-policy data "
                            "(`sprinter-edge verifier collect --policy sprinter`)")
    names = tuple(args.candidates.split(",")) if args.candidates else None
    embedding = _wants_embedding(names)
    cost: Callable[[float], float] | None = None  # None: the study's reference table
    if args.costs == "machine" or embedding:
        # fetches the draft only when its embedding rows are read; loads only what is used
        engine = engine_from(args, method="ar", with_draft=embedding)
        if embedding:
            data = dict(data) | {"embedding": _draft_embeddings(engine, meta, data["token"])}
        if args.costs == "machine":
            from ..costs.table import machine_costs

            table = machine_costs(engine.target)

            def cost(n: float) -> float:  # a catch-up asks for two rows (flagged + bonus)
                return table.cost(n, rows=2.0)
        engine.close()
    cfg = StudyConfig(seed=args.split_seed, cap=args.run_cap, cost=cost, n_boot=args.boot,
                      candidates=names,
                      time_budget_s=args.time_budget * 60 if args.time_budget else None, n_threads=None)
    if (args.ship is None) != (args.export is None):
        raise SprinterError("--ship and --export go together")
    report = run_study(data, cfg)
    if args.ship:
        from ..training.ship import ship_from_study

        pair_name = None
        if not args.target:
            from ..catalog.registry import load_registry

            pair_name = load_registry().pair(args.pair).name
        report["shipped"] = ship_from_study(data, meta, args.ship, args.export, seed=args.split_seed,
                                            cost=cost, cap=args.run_cap, pair_name=pair_name)
        print(f"shipped {args.ship} -> {args.export}: presets {report['shipped']['presets']}, "
              f"per domain {report['shipped']['domain_presets']}")
    report["data"] = {"dir": str(args.data), "behaviour": meta.get("behaviour"),
                      "temperatures": meta.get("config", {}).get("temperatures")}  # type: ignore[union-attr]
    args.out.write_text(json.dumps(report, indent=1))
    md = report_markdown(report)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    print(f"report: {args.out} and {args.out.with_suffix('.md')}")
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from ..catalog.registry import load_registry
    from ..verifiers.onnx import OnnxVerifier

    path = args.file
    task_quality: dict = {}
    if path is None:
        pair = load_registry().pair(args.pair)
        path, task_quality = pair.verifier_path(), pair.task_quality
        if path is None:
            raise SprinterError(f"pair {args.pair!r} ships no verifier; pass a file")
    ver = OnnxVerifier(path)
    if args.max_fp_rate is not None and args.preset is not None:
        raise SprinterError("give --max-fp-rate or --preset, not both")
    chosen = ver.default_threshold
    why = "default"
    if args.max_fp_rate is not None:
        chosen = threshold_for_max_fp(ver.calibration, args.max_fp_rate)
        why = f"eta_FP <= {args.max_fp_rate:g}"
    elif args.preset is not None:
        chosen, why = ver.threshold_for(args.preset), f"preset {args.preset}"
    # an older greedy-label table lacks drift_greedy: it follows from eta_FP and the label-0 share
    table = with_greedy_drift(ver.calibration) if ver.label_rule == "greedy" else ver.calibration
    row = row_at(table, chosen)
    if args.json:
        print(json.dumps({"threshold": chosen, "row": row.__dict__, "tv_pq": ver.tv_pq,
                          "presets": ver.presets, "table": [r.__dict__ for r in table],
                          "task_quality": {p: {b: loss.__dict__ for b, loss in benches.items()}
                                           for p, benches in task_quality.items()}}))
        return 0
    print(f"verifier {path} ({ver.metadata.get('sprinter.model', '?')}, label {ver.label_rule}, "
          f"layout {'+'.join(ver.layout)})")
    print("held-out prompts: threshold -> flag rate, eta_FP (wrong tokens passed, greedy label), "
          "drift per token = mean of 1[pass] * TV(p, q) (greedy; temperature 1)")
    rows = table if args.all else table[4::5]
    print(f"{'threshold':>9} {'flag rate':>9} {'eta_FP':>7} {'false flag':>10} {'accuracy':>8} "
          f"{'drift greedy':>12} {'drift T=1':>9}")
    for r in rows:
        print(f"{r.threshold:9.2f} {r.flag_rate:9.3f} {r.eta_fp:7.3f} {r.false_flag_rate:10.3f} "
              f"{r.accuracy:8.3f} {_opt(r.drift_greedy):>12} {_opt(r.drift_t1):>9}")
    print("presets: " + ", ".join(f"{k}={v:g}" for k, v in ver.presets.items()))
    if task_quality:
        print("task-level loss vs ar (pass-rate points, paired 95% interval, problems), measured end "
              "to end at greedy decoding (models/pairs.toml task_quality):")
        for preset, benches in task_quality.items():
            print(f"  {preset:9} " + "; ".join(f"{b} {loss.describe()}" for b, loss in benches.items()))
    elif args.file is None:
        print("task-level loss: not measured for this pair (run sprinter-edge bench --edits 80 "
              "--humaneval 80 --thresholds presets)")
    print(f"threshold ({why}): {chosen:g}  -> flag rate {row.flag_rate:.3f}, eta_FP {row.eta_fp:.3f}")
    print(drift_line(row, ver.tv_pq))
    return 0


def _opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
