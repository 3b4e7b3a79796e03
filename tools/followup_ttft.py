"""Time to first token of a follow-up on the same file: two turns of one conversation (a rename
in a pasted standard-library module, then a second rename), the chat session reusing the KV of
the first turn. Prints each turn's prompt, tokens reused and read, TTFT and decode speed.

    .venv/bin/python tools/followup_ttft.py [--pair default] [--max-tokens 700]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="default", help="registered pair (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=700,
                    help="reply budget per turn (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default: %(default)s)")
    args = ap.parse_args()
    code = inspect.getsource(heapq)[:3500]
    engine = Engine.from_pair(args.pair, offline=True, hardware=Hardware(n_threads=args.threads))
    session = ChatSession(engine, params=SamplingParams(max_tokens=args.max_tokens))
    for text in TURNS:
        t0 = time.perf_counter()
        gen = session.send(text.format(code=code))
        for _ in gen:
            pass
        result = session.finish(gen)
        turn, s = session.last_turn, result.stats
        assert turn is not None
        print(f"prompt {turn.prompt_tokens} tokens: {turn.reused_tokens} reused, {turn.reread_tokens} read; "
              f"TTFT {s.timings.first_token_seconds:.2f} s; {s.new_tokens} tokens at "
              f"{s.tokens_per_second:.1f} tok/s ({', '.join(s.trace.plans_run)}); "
              f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
