"""`sprinter-edge generate`: one prompt, streamed to the terminal or as one JSON object."""

from __future__ import annotations

import argparse
import json
import sys

from .common import add_decoding_args, add_hardware_args, add_model_args, engine_from, sampling_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate a reply to one prompt",
                       description="Generate text for PROMPT with the chosen decoding method.")
    p.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    p.add_argument("--chat", dest="chat", action="store_true", default=True,
                   help="wrap the prompt in the model's chat template (default)")
    p.add_argument("--no-chat", dest="chat", action="store_false",
                   help="use the prompt as raw text (completion)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: text, token_ids, method, finish_reason, stats")
    p.add_argument("--stats", action="store_true", help="print the counters to stderr afterwards")
    add_decoding_args(p)
    add_model_args(p)
    add_hardware_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    params = sampling_from(args)
    engine = engine_from(args)
    gen = engine.stream(prompt, params, chat=args.chat)
    try:
        for chunk in gen:
            if not args.json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        gen.close()
    result = gen.result
    assert result is not None
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    if args.stats and not args.json:
        s = result.stats
        c, point, trace = s.counters, s.point, s.trace
        print(f"[{s.method}] {s.new_tokens} tokens, {s.tokens_per_second:.2f} tok/s, "
              f"{c.target_calls} target calls ({s.target_calls_per_token:.3f}/token), "
              f"kept {c.kept}, accepted {c.accepted}, resampled {c.resampled}, bonus {c.bonus}",
              file=sys.stderr)
        print(f"[output] {s.guarantee}", file=sys.stderr)
        if c.extra:  # the counters a method keeps of its own (Strategy.counters)
            print("[counters] " + ", ".join(f"{k} {v}" for k, v in sorted(c.extra.items())), file=sys.stderr)
        if c.copied_tokens:
            print(f"[copies] {c.copied_accepted} of {c.copied_tokens} copied tokens accepted "
                  f"(a {s.kind} request)", file=sys.stderr)
        if point.threshold is not None:
            print(f"[verifier] {point.verifier} at threshold {point.threshold:g} (a {point.domain} "
                  "request)", file=sys.stderr)
        t = s.timings
        if c.forced or c.grammar_proposed or t.grammar_seconds:
            print(f"[grammar] {c.forced} tokens forced (no target test), {c.grammar_accepted} of "
                  f"{c.grammar_proposed} fast-forward tokens accepted, {t.grammar_seconds * 1e3:.1f} "
                  f"ms in the grammar ({t.grammar_seconds / t.decode_seconds:.1%} of decoding)",
                  file=sys.stderr)
        if s.prediction is not None:
            print(f"[prediction] {s.prediction.accepted_prediction_tokens} predicted tokens used, "
                  f"{s.prediction.rejected_prediction_tokens} not", file=sys.stderr)
        if trace.plan:
            print(f"[auto] ran {' -> '.join(trace.plans_run) or trace.plan} ({trace.plan_switches} "
                  f"switches): {trace.plan_reason}", file=sys.stderr)
        print(f"[layers] {engine.models.placement()}", file=sys.stderr)
        if getattr(args, "pairing", None) is not None:  # --target: which files ran, and why that draft
            print(f"[models] {args.pairing.describe()}", file=sys.stderr)
    engine.close()
    return 0
