"""Speed hygiene of the decoding engine (issue 3), measured, not asserted in tests.

Prints, for the default pair (or --draft/--target), interleaved prompt by prompt:
  * the engine's own overhead per generated token: wall time minus llama.cpp decode,
    verifier and prefill time, per method (goal: < 1 ms);
  * our `ar` against llama-cpp-python's own `create_completion` on the same model and
    prompt tokens (goal: within 5%);
  * decode calls per SPRINTER catch-up (goal: exactly 1, however long the run).

    python tools/bench_engine.py --max-tokens 96 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.bench.peers import LlamaCppPeer
from sprinter_edge.catalog.registry import load_registry
from sprinter_edge.catalog.store import ensure_pair

PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a mutex is and when to use one.",
    "Write a JavaScript function that deep-clones an object.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", help="draft GGUF (default: the default pair's)")
    p.add_argument("--target", help="target GGUF (default: the default pair's)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per generation")
    p.add_argument("--repeats", type=int, default=2, help="passes over the prompts")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    args = p.parse_args(argv)

    if args.target:
        draft, target = args.draft, args.target
    else:
        draft, target = ensure_pair(load_registry().pair("default"), download=False)
    engine = Engine(target, draft, method="ar", hardware=Hardware(n_ctx=2048, n_threads=args.threads))
    engine.load()
    peer = LlamaCppPeer("llama-cpp", target, n_ctx=2048, n_threads=args.threads)

    ours, theirs = [], []
    overhead: dict[str, list[float]] = {m: [] for m in ("ar", "sd", "sprinter")}
    catchup_calls = []
    for _ in range(args.repeats):
        for prompt in PROMPTS:
            tokens = engine.encode(prompt)
            r = engine.generate(tokens, SamplingParams(max_tokens=args.max_tokens), method="ar")
            # same measure as the peer: tokens after the first over the time after the first
            ours.append(r.stats.new_tokens / r.stats.timings.decode_seconds)
            run = peer.generate(tokens, args.max_tokens)
            theirs.append(run.tokens_per_second)
            for method in overhead:
                s = engine.generate(tokens, SamplingParams(max_tokens=args.max_tokens), method=method).stats
                overhead[method].append(s.overhead_seconds / max(1, s.new_tokens) * 1e3)
                if method == "sprinter":
                    catchup_calls.append(s.target_calls / max(1, s.pq_tests))
    print(f"ar tok/s: sprinter-edge {statistics.median(ours):.2f}  llama-cpp-python create_completion "
          f"{statistics.median(theirs):.2f}  ratio {statistics.median(ours) / statistics.median(theirs):.3f}")
    for method, values in overhead.items():
        print(f"engine overhead per token, {method:8}: median {statistics.median(values):.3f} ms, "
              f"max {max(values):.3f} ms")
    print(f"target decode calls per SPRINTER catch-up: {statistics.mean(catchup_calls):.3f}")
    peer.close()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
