"""sprinter-edge quickstart: generate, stream and chat from Python.

    python examples/quickstart.py                      # the default pair (downloaded once)
    python examples/quickstart.py TARGET.gguf DRAFT.gguf [--max-tokens N]   # any local pair
"""

from __future__ import annotations

import argparse

from sprinter_edge import Engine, Hardware, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", help="local target GGUF (default: the default pair)")
    parser.add_argument("draft", nargs="?", help="local draft GGUF sharing the target's tokenizer")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per reply")
    args = parser.parse_args()

    hardware = Hardware(n_ctx=2048)  # threads, context size, GPU layers for draft and target
    if args.target:
        # without a trained verifier for a custom pair, sprinter uses the confidence rule
        engine = Engine.from_files(args.target, draft=args.draft, method="sprinter", hardware=hardware,
                                   verifier="confidence")
    else:
        engine = Engine.from_pair("default", method="sprinter", hardware=hardware)

    with engine:
        # 1. one call, the whole reply
        params = SamplingParams(max_tokens=args.max_tokens)
        result = engine.generate("Write a Python function that reverses a string.", params)
        print(result.text)
        print(f"-- {result.stats.new_tokens} tokens, {result.stats.tokens_per_second:.1f} tok/s, "
              f"{result.stats.target_calls} target calls, finish: {result.finish_reason}\n")

        # 2. streaming: print text as it is generated
        gen = engine.stream("Explain recursion in one paragraph.", params)
        for chunk in gen:
            print(chunk.text, end="", flush=True)
        print(f"\n-- {gen.result.stats.to_dict()['target_calls_per_token']} target calls per token\n")

        # 3. chat: a conversation with the model's own chat template
        messages = [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is a GGUF file?"},
        ]
        reply = engine.chat(messages, params)
        print(reply.text)

        # 4. another method on the same loaded models (lossless speculative decoding)
        exact = engine.generate("List three prime numbers.", params, method="sd")
        print(f"\n[sd] {exact.text}")


if __name__ == "__main__":
    main()
