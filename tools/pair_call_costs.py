#!/usr/bin/env python3
"""Time the default pair's decode calls at one context depth, both models loaded: a step and a
batched read of each model. The figures behind "what a written draft token saves" in
docs/journal.md (a step and a row of each model, where the bench's cost table is shallow).

    .venv/bin/python tools/pair_call_costs.py [--depth 1800] [--repeats 10] [--flash-attn auto|on|off]
"""

from __future__ import annotations

import argparse
import ntpath
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from sprinter_edge.backend.llama import FLASH_ATTN, LlamaModel, LoadOptions

MODELS = Path.home() / ".cache" / "sprinter-edge" / "models"
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_0-hq4.gguf"


def median_ms(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=1800, help="tokens of context before each timed call")
    ap.add_argument("--repeats", type=int, default=10, help="calls timed per figure (median shown)")
    ap.add_argument("--threads", type=int, default=2, help="threads per model")
    ap.add_argument("--flash-attn", choices=FLASH_ATTN, default="auto",
                    help="llama.cpp's flash attention (auto: the engine's default)")
    args = ap.parse_args()
    options = LoadOptions(n_ctx=4096, n_threads=args.threads, flash_attn=args.flash_attn)
    models = {"target": LlamaModel(MODELS / TARGET, options), "draft": LlamaModel(MODELS / DRAFT, options)}
    text = Path(ntpath.__file__).read_text() * 4  # any real code; read twice over if short
    context = models["target"].tokenize(text)[: args.depth + 64]
    for model in models.values():
        model.eval(context[: args.depth])
    tokens = context[args.depth:]
    for role, model in models.items():
        print(f"{role}: flash attention {model.flash_attn}")
        for rows in (1, 9, 17, 33):
            def call(model: LlamaModel = model, rows: int = rows) -> object:
                model.rollback(args.depth)
                return model.eval(tokens[:rows], n_logits=rows)
            ms = median_ms(call, args.repeats)
            print(f"{role} {rows:2d} rows after {args.depth} tokens: {ms:6.1f} ms "
                  f"({ms / rows:5.1f} ms a row)")


if __name__ == "__main__":
    main()
