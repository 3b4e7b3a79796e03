"""How much of decoding is sampling and verifier work: one reply under cProfile (issue 18's
"at temperature 0.7, sampling and verifier work <= 3% of decode time").

Runs `--method` at `--temperature` on an edit task of the bench (or `--prompt`), after a warm-up
reply, and prints the time inside the sampler (prepare: penalties and the distribution; draw;
the p/q test) and the verifier against the decode time the engine reports. Usage:

    python tools/profile_sampling.py --method lookup --temperature 0.7
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.bench.edits import FUNCTIONS

# (file suffix, function name) of the work this measures, cumulative time each
SAMPLING = (("sampling.py", "prepare"), ("sampling.py", "draw"), ("sampling.py", "verify"))
VERIFIER = (("base.py", "score"), ("onnx.py", "score"), ("simple.py", "score"))


def cumulative(stats: pstats.Stats, wanted: tuple[tuple[str, str], ...]) -> dict[str, float]:
    """Cumulative seconds of each wanted function, counting only calls from outside the wanted
    set (verify draws on a rejection: that draw is inside verify's time already)."""
    def is_wanted(key: tuple[str, int, str]) -> bool:
        return any(key[2] == fn and key[0].endswith(suffix) for suffix, fn in wanted)

    out: dict[str, float] = {}
    for key, (_, _, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if is_wanted(key):
            label = f"{key[0].rsplit('/', 1)[-1]}:{key[2]}"
            outside = sum(ct for caller, (_, _, _, ct) in callers.items() if not is_wanted(caller))
            out[label] = out.get(label, 0.0) + outside
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--pair", default="default", help="registered pair")
    ap.add_argument("--method", default="lookup", help="decoding method")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    ap.add_argument("--max-tokens", type=int, default=200, help="tokens of the profiled reply")
    ap.add_argument("--task", type=int, default=3, help="which of the first edit tasks "
                    "(tuning split) is the prompt")
    ap.add_argument("--prompt", default=None, help="a prompt instead of an edit task")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = ap.parse_args()

    # speed work sees the tuning side of the edit tasks only (the report side is for the docs)
    prompt = args.prompt or FUNCTIONS.prompts(args.task + 1, split="tuning")[args.task].text
    engine = Engine.from_pair(args.pair, offline=True, method=args.method,
                              hardware=Hardware(n_threads=args.threads, n_ctx=4096))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    engine.generate(prompt, params.replace(max_tokens=32))  # warm-up: loads, costs, first pages
    profiler = cProfile.Profile()
    profiler.enable()
    result = engine.generate(prompt, params)
    profiler.disable()
    engine.close()
    stats = pstats.Stats(profiler)
    decode = result.stats.timings.decode_seconds
    sampling = cumulative(stats, SAMPLING)
    verifier = cumulative(stats, VERIFIER)
    total = sum(sampling.values()) + sum(verifier.values())
    print(json.dumps({
        "method": args.method, "temperature": args.temperature, "tokens": result.stats.new_tokens,
        "decode_seconds": round(decode, 3), "tokens_per_second": round(result.stats.tokens_per_second, 2),
        "seconds": {k: round(v, 4) for k, v in {**sampling, **verifier}.items()},
        "share_of_decode": round(total / decode, 4),
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
