"""How much of a constrained reply's decoding is the grammar's own work (llguidance: masks,
consuming tokens, fast-forward, rollback): `Timings.grammar_seconds` against the decode time,
per request, for a few JSON-schema requests on a registered pair under each `--methods`.

Each method first answers one request unmeasured (loads, cost tables, the schema's compile),
then every request once, greedy. Usage:

    python tools/profile_grammar.py --methods ar auto --max-tokens 96
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.grammar import Constraint

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person as JSON: name, age, favourite colour.",
     {"type": "object", "properties": {
         "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
         "colour": {"enum": ["red", "green", "blue"]}},
      "required": ["name", "age", "colour"], "additionalProperties": False}),
    ("Give a Python function's signature as JSON: its name, parameters and return type, for a "
     "function that merges two sorted lists.",
     {"type": "object", "properties": {
         "name": {"type": "string"},
         "parameters": {"type": "array", "items": {"type": "object", "properties": {
             "name": {"type": "string"}, "type": {"type": "string"}},
             "required": ["name", "type"], "additionalProperties": False}},
         "returns": {"type": "string"}},
      "required": ["name", "parameters", "returns"], "additionalProperties": False}),
    ("List three programming languages and the year each appeared, as JSON.",
     {"type": "object", "properties": {"languages": {"type": "array", "maxItems": 3, "items": {
         "type": "object", "properties": {"name": {"type": "string"}, "year": {"type": "integer"}},
         "required": ["name", "year"], "additionalProperties": False}}},
      "required": ["languages"], "additionalProperties": False}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--pair", default="default", help="registered pair")
    ap.add_argument("--methods", nargs="+", default=["ar", "auto"], help="decoding methods")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per reply at most")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    args = ap.parse_args()

    rows = []
    for method in args.methods:
        engine = Engine.from_pair(args.pair, offline=True, method=method,
                                  hardware=Hardware(n_threads=args.threads, n_ctx=2048))
        warm = Constraint.json_schema(REQUESTS[0][1])
        engine.generate(REQUESTS[0][0], SamplingParams(max_tokens=16, constraint=warm))
        for i, (prompt, schema) in enumerate(REQUESTS):
            params = SamplingParams(max_tokens=args.max_tokens, constraint=Constraint.json_schema(schema))
            st = engine.generate(prompt, params).stats
            t, c = st.timings, st.counters
            rows.append({"method": method, "request": i, "tokens": c.new_tokens, "forced": c.forced,
                         "finish": st.finish_reason, "decode_seconds": round(t.decode_seconds, 3),
                         "grammar_seconds": round(t.grammar_seconds, 4),
                         "grammar_share": round(t.grammar_seconds / t.decode_seconds, 4),
                         "grammar_ms_per_token": round(t.grammar_seconds * 1e3 / max(1, c.new_tokens), 3)})
            print(json.dumps(rows[-1]), flush=True)
        engine.close()
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        grammar = sum(r["grammar_seconds"] for r in mine)
        decode = sum(r["decode_seconds"] for r in mine)
        print(f"{method}: {grammar:.3f} s in the grammar of {decode:.2f} s decoding "
              f"({grammar / decode:.1%}), {sum(r['tokens'] for r in mine)} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
