"""Time to first token of a follow-up on the same file: two turns of one conversation (a rename
in a pasted standard-library module, then a second rename), the chat session reusing the KV of
the first turn; and the same follow-up when another conversation's request came in between
(A, B, A's follow-up), where the prompt cache (--cache-ram) restores A's KV. Prints each turn's
prompt, tokens reused and read, TTFT and decode speed.

    .venv/bin/python tools/followup_ttft.py [--pair default] [--max-tokens 700] [--case both]
"""

from __future__ import annotations

import argparse
import heapq
import inspect
import time

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.serving.chat_session import ChatSession

TURNS = (
    "Rename the function `heappush` to `push_item` everywhere. Return the whole code in one python "
    "code block.\n\n```python\n{code}```",
    "Now also rename `heappop` to `pop_item`, and return the whole code again.",
)
OTHER = "Write a Python function that parses an ISO 8601 date without the datetime module."


def turn(session: ChatSession, text: str, label: str) -> None:
    t0 = time.perf_counter()
    gen = session.send(text)
    for _ in gen:
        pass
    result = session.finish(gen)
    info, s = session.last_turn, result.stats
    assert info is not None
    print(f"{label}: prompt {info.prompt_tokens} tokens: {info.reused_tokens} reused, "
          f"{info.reread_tokens} read; TTFT {s.timings.first_token_seconds:.2f} s; {s.new_tokens} "
          f"tokens at {s.tokens_per_second:.1f} tok/s ({', '.join(s.trace.plans_run)}); "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="default", help="registered pair (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=700,
                    help="reply budget per turn (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default: %(default)s)")
    ap.add_argument("--case", choices=("same", "interleaved", "both"), default="both",
                    help="same: A then A's follow-up; interleaved: A, another conversation B, then "
                         "A's follow-up (default: %(default)s)")
    ap.add_argument("--cache-ram", type=float, default=1024, metavar="MIB",
                    help="prompt cache budget; 0 turns it off (default: %(default)s)")
    args = ap.parse_args()
    code = inspect.getsource(heapq)[:3500]
    engine = Engine.from_pair(args.pair, offline=True, hardware=Hardware(n_threads=args.threads),
                              prompt_cache_mib=args.cache_ram)
    params = SamplingParams(max_tokens=args.max_tokens)
    if args.case in ("same", "both"):
        a = ChatSession(engine, params=params)
        turn(a, TURNS[0].format(code=code), "same A")
        turn(a, TURNS[1], "same A follow-up")
        engine.reset_caches()
    if args.case in ("interleaved", "both"):
        a, b = ChatSession(engine, params=params), ChatSession(engine, params=params)
        turn(a, TURNS[0].format(code=code), "interleaved A")
        turn(b, OTHER, "interleaved B")
        turn(a, TURNS[1], "interleaved A follow-up")


if __name__ == "__main__":
    main()
